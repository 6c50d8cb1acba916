//! The ratio level a dumped `prob_ratio` row shows: GSPO's sequence ratio is one value at
//! every token of a row (verl `compute_policy_loss_gspo` computes it as
//! `exp(log_prob − sg(log_prob) + sg(mean log-ratio))`, whose first terms cancel exactly),
//! a token ratio varies along it. dumpdiff (the other side's dumped ratio) and the judge
//! (losscheck's policy search) both read the level from it.

/// The shape of one row's valid ratios: `Some(true)` when they are one value to one f32
/// ulp (GSPO's sequence ratio), `Some(false)` when they vary beyond it (a token ratio),
/// `None` for fewer than two values (a row that tells neither).
pub fn row_shape(values: impl IntoIterator<Item = f64>) -> Option<bool> {
    let mut xs = values.into_iter();
    let first = xs.next()?;
    let (mut lo, mut hi, mut n) = (first, first, 1);
    for x in xs {
        (lo, hi, n) = (lo.min(x), hi.max(x), n + 1);
    }
    // a row of NaNs (min/max skip NaN) is not called varying: only a spread beyond the
    // ulp is
    let spread = hi - lo;
    let ulp = 2f64.powi(-23) * hi.abs().max(lo.abs());
    (n >= 2).then(|| spread.partial_cmp(&ulp) != Some(std::cmp::Ordering::Greater))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_sequence_shaped_to_one_f32_ulp() {
        assert_eq!(row_shape([1.25, 1.25, 1.25]), Some(true));
        let ulp = 1.25 * 2f64.powi(-23);
        assert_eq!(row_shape([1.25, 1.25 + ulp]), Some(true));
        assert_eq!(row_shape([1.25, 1.25 + 2.0 * ulp]), Some(false));
        assert_eq!(row_shape([0.9, 1.1]), Some(false));
        assert_eq!(row_shape([1.0]), None);
        assert_eq!(row_shape([]), None);
        assert_eq!(row_shape([f64::NAN, f64::NAN]), Some(true));
    }
}
