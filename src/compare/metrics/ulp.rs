//! Distances in units in the last place, and the coarsest float grid a tensor's values
//! sit on (bf16 data held as f32, f32 data held as f64).

use crate::tensor::DType;

/// Map a float's bits to an integer line where adjacent floats differ by one.
fn ordered(bits: u64, sign_bit: u64) -> i128 {
    if bits & sign_bit != 0 {
        -((bits & !sign_bit) as i128)
    } else {
        bits as i128
    }
}

/// Distance in units in the last place of `dtype` between two values of that dtype
/// (held in f64 exactly). NaN against anything is `u64::MAX`; equal values (±0 too) are 0.
pub fn ulp_distance(a: f64, b: f64, dtype: DType) -> u64 {
    if a.is_nan() || b.is_nan() {
        return if a.is_nan() && b.is_nan() {
            0
        } else {
            u64::MAX
        };
    }
    if a == b {
        return 0;
    }
    let (x, y) = match dtype {
        DType::F64 => (ordered(a.to_bits(), 1 << 63), ordered(b.to_bits(), 1 << 63)),
        DType::F32 => (
            ordered((a as f32).to_bits() as u64, 1 << 31),
            ordered((b as f32).to_bits() as u64, 1 << 31),
        ),
        DType::BF16 => (
            ordered(half::bf16::from_f64(a).to_bits() as u64, 1 << 15),
            ordered(half::bf16::from_f64(b).to_bits() as u64, 1 << 15),
        ),
        DType::F16 => (
            ordered(half::f16::from_f64(a).to_bits() as u64, 1 << 15),
            ordered(half::f16::from_f64(b).to_bits() as u64, 1 << 15),
        ),
        _ => return (a - b).abs().min(u64::MAX as f64) as u64,
    };
    u64::try_from((x - y).unsigned_abs()).unwrap_or(u64::MAX)
}

/// The coarsest float precision whose grid holds every value exactly: an f32 tensor of
/// bf16-rounded numbers is bf16 data, a `.jsonl` f64 list of f32 numbers is f32 data.
/// Non-float dtypes come back unchanged.
pub fn effective_dtype(declared: DType, values: &[f64]) -> DType {
    let mut scan = GridScan::new(declared);
    scan.feed(values);
    if scan.needs_f16() {
        scan.feed_f16(values);
    }
    scan.finish()
}

/// [`effective_dtype`] over values seen in pieces (a tensor decoded chunk by chunk): feed
/// every piece, then, only if [`GridScan::needs_f16`], every piece again to
/// [`GridScan::feed_f16`] (the f16 test is the costly one and rarely decides).
#[derive(Debug, Clone, Copy)]
pub struct GridScan {
    declared: DType,
    /// Every finite value fed is an f32.
    f32: bool,
    /// … on the bf16 grid.
    bf16: bool,
    /// … on the f16 grid (None until [`GridScan::feed_f16`]).
    f16: Option<bool>,
}

impl GridScan {
    /// Nothing seen yet.
    pub fn new(declared: DType) -> Self {
        GridScan {
            declared,
            f32: true,
            bf16: true,
            f16: None,
        }
    }

    /// The declared dtype decides alone (not a float, or already a 16-bit float).
    fn fixed(&self) -> bool {
        !self.declared.is_float() || matches!(self.declared, DType::BF16 | DType::F16)
    }

    /// True when no further [`GridScan::feed`] can change the answer.
    pub fn settled(&self) -> bool {
        self.fixed()
            || (self.declared == DType::F64 && !self.f32)
            || (self.declared == DType::F32 && !self.bf16)
    }

    /// Look at more values (f32 and bf16 grids).
    pub fn feed(&mut self, values: &[f64]) {
        if self.settled() {
            return;
        }
        // Blocks of values, so that a decided scan stops early and each block's loop is
        // branch-free (it vectorises).
        for block in values.chunks(1024) {
            let (f32_ok, bf16_ok) = grid_block(block);
            self.f32 &= f32_ok;
            self.bf16 &= bf16_ok;
            if self.settled() {
                return;
            }
        }
    }

    /// Record that some value (an f32) lies off the bf16 grid, as [`GridScan::feed`] of it
    /// would.
    pub fn saw_off_bf16(&mut self) {
        self.bf16 = false;
    }

    /// True when the answer, after every value went through [`GridScan::feed`], depends
    /// on the f16 grid: the values are f32s, not all on the bf16 grid.
    pub fn needs_f16(&self) -> bool {
        !self.fixed() && self.f32 && !self.bf16 && self.f16 != Some(false)
    }

    /// Look at more values for the f16 grid.
    pub fn feed_f16(&mut self, values: &[f64]) {
        if self.f16 != Some(false) {
            let on_grid = values
                .iter()
                .filter(|v| v.is_finite())
                .all(|&v| half::f16::from_f64(v).to_f64() == v);
            self.f16 = Some(on_grid);
        }
    }

    /// The precision of everything fed.
    pub fn finish(self) -> DType {
        let d = self.declared;
        if self.fixed() {
            return d;
        }
        if !self.f32 {
            // Not even f32s: f64 data, or (declared f32) off every coarser grid too.
            return if d == DType::F64 {
                DType::F64
            } else {
                DType::F32
            };
        }
        if self.bf16 {
            DType::BF16
        } else if self.f16 == Some(true) {
            DType::F16
        } else {
            DType::F32
        }
    }
}

/// Whether every finite value of `block` is an f32, and whether each is on the bf16 grid;
/// compiled for AVX2 too where the CPU has it (the same conversions and tests).
fn grid_block(block: &[f64]) -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked on the line above.
        return unsafe { grid_block_avx2(block) };
    }
    grid_block_body(block)
}

/// [`grid_block_body`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn grid_block_avx2(block: &[f64]) -> (bool, bool) {
    grid_block_body(block)
}

/// One branch-free pass (it vectorises).
#[inline(always)]
fn grid_block_body(block: &[f64]) -> (bool, bool) {
    let (mut f32_ok, mut bf16_ok) = (true, true);
    for &v in block {
        // bf16 is the upper half of f32: a value is on its grid when it is an f32
        // whose low 16 bits are zero (the same test as a bf16 round trip).
        let f = v as f32;
        let exact = f as f64 == v;
        let skip = !v.is_finite();
        f32_ok &= skip | exact;
        bf16_ok &= skip | (exact & (f.to_bits() & 0xFFFF == 0));
    }
    (f32_ok, bf16_ok)
}
