//! `exp` of log-probs stored on a coarse grid (bf16 or f16, or f32 holding such values),
//! looked up when seen before instead of recomputed: such a tensor holds a few thousand
//! distinct values, so most of its `exp` calls repeat an earlier one. The value returned
//! is the one `f64::exp` returned for the same bits, so nothing changes by a bit.

use std::cell::RefCell;

/// Mantissa bits below a 10-bit mantissa (f16's; bf16 keeps 7): zero on those grids.
const BELOW_GRID: u64 = (1 << 42) - 1;
/// Slots of the table: one per 10-bit mantissa over 64 binades (the sign is not part of
/// the slot: a value and its negation share one, the stored bits tell them apart).
const SLOTS: usize = 1 << 16;

/// The slot of a value on the grid: its 6 low exponent bits and top 7 mantissa bits
/// side by side (bf16's grid: a tensor's values fill neighbouring slots, a few tens
/// of KB that stay in cache), the 3 further f16 mantissa bits above them.
#[inline(always)]
fn slot(bits: u64) -> usize {
    (((bits >> 45) & 0x1fff) | (((bits >> 42) & 7) << 13)) as usize
}

/// A direct-mapped table of `(bits of x, exp(x))`; every slot starts as `exp(+0) = 1`.
pub(super) struct ExpMemo {
    slots: Box<[(u64, f64)]>,
}

thread_local! {
    /// One table per thread (1 MB, allocated on the thread's first log-prob run).
    static MEMO: RefCell<Option<ExpMemo>> = const { RefCell::new(None) };
}

impl ExpMemo {
    fn new() -> ExpMemo {
        ExpMemo {
            slots: vec![(0f64.to_bits(), 1.0); SLOTS].into_boxed_slice(),
        }
    }

    /// `x.exp()`: from the table when `x` sits on a 10-bit-mantissa grid and was seen
    /// before (the slot holds its exact bits), else computed (and kept, on the grid).
    #[inline(always)]
    pub(super) fn exp(&mut self, x: f64) -> f64 {
        let bits = x.to_bits();
        if bits & BELOW_GRID != 0 {
            return x.exp();
        }
        let slot = &mut self.slots[slot(bits)];
        if slot.0 == bits {
            return slot.1;
        }
        let v = x.exp();
        *slot = (bits, v);
        v
    }

    /// `x.exp()` of a value not worth looking up (a difference of log-probs).
    #[inline(always)]
    pub(super) fn exp_off_grid(&self, x: f64) -> f64 {
        x.exp()
    }

    /// Run `f` with this thread's table.
    pub(super) fn with<R>(f: impl FnOnce(&mut ExpMemo) -> R) -> R {
        MEMO.with(|m| {
            let mut m = m.borrow_mut();
            f(m.get_or_insert_with(ExpMemo::new))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looked_up_exp_is_f64_exp_bit_for_bit() {
        // Every bf16 and f16 value (both signs, subnormals, ±inf, NaN) twice over, values
        // off the grid, and values whose slots collide: always `f64::exp`'s bits.
        let mut m = ExpMemo::new();
        let mut xs: Vec<f64> = (0..=u16::MAX)
            .map(|b| half::bf16::from_bits(b).to_f64())
            .collect();
        xs.extend((0..=u16::MAX).map(|b| half::f16::from_bits(b).to_f64()));
        xs.extend([
            -0.1,
            1e-300,
            709.8,
            -745.2,
            2f64.powi(-900),
            -2f64.powi(300),
        ]);
        for _ in 0..2 {
            for &x in &xs {
                assert_eq!(m.exp(x).to_bits(), x.exp().to_bits(), "{x:e}");
            }
        }
        // Not vacuous: log-probs on the bf16 grid (−20 to −2^−40: 45 binades, each value
        // its own slot) are all in the table after one pass.
        let lp: Vec<f64> = (0..=u16::MAX)
            .map(|b| half::bf16::from_bits(b).to_f64())
            .filter(|x| (-20.0..=-(2f64.powi(-40))).contains(x))
            .collect();
        lp.iter().for_each(|&x| _ = m.exp(x));
        let found = lp
            .iter()
            .filter(|&&x| m.slots[slot(x.to_bits())].0 == x.to_bits())
            .count();
        assert!(
            lp.len() > 5_000 && found == lp.len(),
            "{found} of {}",
            lp.len()
        );
    }
}
