use super::*;
use crate::model::record::{Field, Record};
use crate::value::Value;

/// The runs of non-zero values of `row`, by a plain scan (what `Mat::nonzero` must
/// give).
fn scan_runs(row: &[f64]) -> Vec<std::ops::Range<usize>> {
    let (w, mut want, mut i) = (row.len(), Vec::new(), 0);
    while i < w {
        if row[i] != 0.0 {
            let s = i;
            while i < w && row[i] != 0.0 {
                i += 1;
            }
            want.push(s..i);
        } else {
            i += 1;
        }
    }
    want
}

fn stored(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Mat {
    let t = Tensor::from_le_bytes(dtype, shape, bytes).unwrap();
    let m = Mat::flat(&t);
    assert!(matches!(m.values, Values::Stored(_)));
    m
}

#[test]
fn stored_values_read_as_to_f64_vec_does() {
    for (dtype, bytes) in [
        (
            DType::BF16,
            vec![0x80, 0x3f, 0x00, 0xc0, 0x01, 0x7f, 0xc0, 0x7f],
        ),
        (
            DType::F16,
            vec![0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00, 0x00, 0x7e],
        ),
        (DType::I8, vec![0xff, 0x7f, 0x80, 0x00]),
        (DType::Bool, vec![0, 1, 2, 255]),
        (
            DType::I32,
            (-3i32..5).flat_map(|v| v.to_le_bytes()).collect(),
        ),
    ] {
        let t = Tensor::from_le_bytes(dtype, vec![bytes.len() / dtype.size()], bytes).unwrap();
        let want = t.to_f64_vec();
        let m = Mat::flat(&t);
        let got = m.values();
        assert_eq!(format!("{got:?}"), format!("{want:?}"), "{dtype}");
        let mut buf = Vec::new();
        let n = want.len();
        assert_eq!(
            format!("{:?}", m.chunk(0, 1, n + 5, &mut buf)),
            format!("{:?}", &want[1..])
        );
        assert_eq!(
            m.get(0, n - 1).map(f64::to_bits),
            Some(want[n - 1].to_bits())
        );
        assert_eq!(m.get(0, n), None);
    }
}

#[test]
fn rows_chunks_and_gets_of_a_stored_matrix() {
    let vals: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
    let t = Tensor::from_le_bytes(
        DType::F32,
        vec![3, 4],
        vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
    )
    .unwrap();
    let v = Value::Dict(vec![(Value::Str("x".into()), Value::Tensor(t))]);
    let names = |f: Field| (f == Field::LogProbs).then_some("x");
    let m = Mat::of(&Record::new(v, names), Field::LogProbs).unwrap();
    assert_eq!((m.rows, m.width, m.dtype), (3, 4, DType::F32));
    assert_eq!(&*m.row(1), &[2.0, 2.5, 3.0, 3.5]);
    assert!(m.row(3).is_empty());
    let mut buf = Vec::new();
    assert_eq!(m.chunk(2, 1, 3, &mut buf), &[4.5, 5.0]);
    assert!(m.chunk(5, 0, 4, &mut buf).is_empty());
    assert_eq!(m.get(2, 3), Some(5.5));
    assert_eq!(m.get(1, 4), None);
}

#[test]
fn nonzero_runs_per_row() {
    let nan = f64::NAN;
    let m = Mat::new(
        vec![3, 5],
        3,
        5,
        vec![
            1.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, nan, 0.0, -1.0, 1.0, 0.0,
        ],
        DType::F64,
    );
    assert_eq!(m.nonzero(0), &[0..2, 4..5]);
    assert!(m.nonzero(1).is_empty());
    assert_eq!(m.nonzero(2), &[0..1, 2..4]);
    assert!(m.nonzero(3).is_empty());
    let wide = Mat::new(
        vec![CHUNK + 3],
        1,
        CHUNK + 3,
        vec![1.0; CHUNK + 3],
        DType::F64,
    );
    assert_eq!(wide.nonzero(0), std::slice::from_ref(&(0..CHUNK + 3)));
}

#[test]
fn nonzero_runs_across_words_equal_a_scan() {
    // Runs that start, end or span the 64-position words, against a plain scan.
    let mut seed = 5u64;
    for w in [1, 63, 64, 65, 127, 128, 129, 300] {
        for density in [0u64, 1, 3, 7, 8] {
            let vals: Vec<f64> = (0..3 * w)
                .map(|i| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let keep = (seed >> 40) % 8 < density || (i / 37) % 2 == 1;
                    if keep {
                        1.0
                    } else {
                        0.0
                    }
                })
                .collect();
            let m = Mat::new(vec![3, w], 3, w, vals.clone(), DType::F64);
            for r in 0..3 {
                let row = &vals[r * w..(r + 1) * w];
                let want = scan_runs(row);
                assert_eq!(m.nonzero(r), &want[..], "w {w} density {density} row {r}");
            }
        }
    }
}

#[test]
fn stored_nonzero_runs_across_words_equal_a_scan() {
    // Every stored width (1, 2, 4, 8 bytes), runs starting, ending and spanning the
    // 64-position words, float signs (±0 zero, NaN not), against a scan of the
    // widened values.
    let mut seed = 11u64;
    let mut next = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        seed >> 33
    };
    for dtype in [DType::Bool, DType::BF16, DType::I32, DType::F32, DType::I64] {
        for w in [1, 7, 63, 64, 65, 129, 200] {
            let vals: Vec<f64> = (0..3 * w)
                .map(|i| match (next() % 8, (i / 23) % 3) {
                    (_, 1) => 0.0,
                    (0, _) if dtype.is_float() => -0.0,
                    (1, _) if dtype.is_float() => f64::NAN,
                    (2 | 3, _) => 0.0,
                    _ => 1.0,
                })
                .collect();
            let bytes: Vec<u8> = vals
                .iter()
                .flat_map(|&v| match dtype {
                    DType::Bool => vec![v as u8],
                    DType::BF16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
                    DType::I32 => (v as i32).to_le_bytes().to_vec(),
                    DType::F32 => (v as f32).to_le_bytes().to_vec(),
                    _ => (v as i64).to_le_bytes().to_vec(),
                })
                .collect();
            let t = Tensor::from_le_bytes(dtype, vec![3, w], bytes).unwrap();
            let m = Mat::from_tensor(&t, 3, w);
            assert!(matches!(m.values, Values::Stored(_)));
            for r in 0..3 {
                let row = &vals[r * w..(r + 1) * w];
                let want = scan_runs(row);
                assert_eq!(m.nonzero(r), &want[..], "{dtype} w {w} row {r}");
            }
        }
    }
}

#[test]
fn stored_nonzero_runs_read_the_bits() {
    // Floats: ±0 are zero, NaN is not (as `v != 0.0` on the widened value).
    let f: Vec<u8> = [1.0f32, -0.0, 0.0, f32::NAN, 2.0, 0.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(stored(DType::F32, vec![6], f).nonzero(0), &[0..1, 3..5]);
    let h: Vec<u8> = [0.0f64, -0.0, 1.0]
        .iter()
        .flat_map(|&v| half::bf16::from_f64(v).to_le_bytes())
        .collect();
    assert_eq!(
        stored(DType::BF16, vec![3], h).nonzero(0),
        std::slice::from_ref(&(2..3))
    );
    let b = stored(DType::Bool, vec![2, 3], vec![0, 2, 1, 0, 0, 0]);
    assert_eq!(b.nonzero(0), std::slice::from_ref(&(1..3)));
    assert!(b.nonzero(1).is_empty());
    let i: Vec<u8> = [0i64, -1, 0, 1 << 40]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(stored(DType::I64, vec![4], i).nonzero(0), &[1..2, 3..4]);
}

#[test]
fn same_values_compares_bits_dtype_and_layout() {
    let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let a = stored(DType::F32, vec![2, 2], f(&[1.0, 2.0, 3.0, 4.0]));
    assert!(a.same_values(&stored(DType::F32, vec![2, 2], f(&[1.0, 2.0, 3.0, 4.0]))));
    assert!(!a.same_values(&stored(DType::F32, vec![2, 2], f(&[1.0, 2.0, 3.0, 4.5]))));
    assert!(!a.same_values(&stored(DType::F32, vec![3], f(&[1.0, 2.0, 3.0]))));
    let i: Vec<u8> = [1i32, 2, 3, 4]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert!(!a.same_values(&stored(DType::I32, vec![2, 2], i)));
    let o = Mat::new(vec![2], 1, 2, vec![0.0, 1.0], DType::F64);
    assert!(o.same_values(&Mat::new(vec![2], 1, 2, vec![0.0, 1.0], DType::F64)));
    assert!(!o.same_values(&Mat::new(vec![2], 1, 2, vec![-0.0, 1.0], DType::F64)));
}

#[test]
fn stored_precision_equals_effective_dtype_of_all_values() {
    let cases: Vec<Vec<f32>> = vec![
        vec![1.0, -2.5, 0.0],                             // bf16 grid
        vec![1.0, 0.1, 2.0],                              // f32
        vec![1.0, 1.0 + 1.0 / 1024.0, 3.0],               // f16 grid, not bf16
        vec![f32::NAN, 1.0, f32::INFINITY],               // non-finite ignored
        (0..3 * CHUNK).map(|i| i as f32 / 8.0).collect(), // f16 until it is not
        (0..3 * CHUNK)
            .map(|i| if i == 3 * CHUNK - 1 { 0.1 } else { 1.0 })
            .collect(), // the last chunk decides
    ];
    for vals in cases {
        let bytes = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let m = stored(DType::F32, vec![vals.len()], bytes);
        let all: Vec<f64> = vals.iter().map(|&v| v as f64).collect();
        assert_eq!(
            m.precision(),
            effective_dtype(DType::F32, &all),
            "{:?}",
            &vals[..3]
        );
    }
}
