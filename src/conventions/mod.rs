//! Producer conventions that a comparison must know before it can call two numbers
//! different: the loss composition's coefficients and the rounding a recompute inherits
//! from its inputs' stored dtypes.
//!
//! Pure functions over plain numbers (no readers, no tools), so that `dumpdiff` and
//! `losscheck` can both use them (dumpdiff: each side's coefficients in
//! `dumpdiff::conventions`, and the rounding bound that decides a loss's aggregation
//! mode):
//!
//! - [`coefficients`]: infer `entropy_coeff` and `kl_coef` from the dumped loss terms of
//!   every cell by least squares, with the fit's residual, and tell whether two sides'
//!   coefficients differ.
//! - [`rounding`]: the tolerance of a reduction recomputed from rounded inputs, from each
//!   input's unit roundoff and the reduction length.
//! - [`advantage`]: the epsilon of group-normalised advantages, from dumped advantage rows
//!   or from the candidates under which a tree's pg terms follow.
//! - [`aggregation`]: which aggregation mode a side's dumped reductions show — one
//!   majority rule for both tools ([`aggregation::settle`]), dumpdiff's per-cell evidence
//!   ([`aggregation::cell_mode`]).
//!
//! The first two are tested against values computed by torch in f64
//! (`fixtures/scenarios/conventions.json`, written by `fixtures/gen/make_scenarios.py
//! --conventions-manifest`).

pub mod advantage;
pub mod aggregation;
pub mod coefficients;
pub mod ratio_level;
pub mod rounding;

#[cfg(test)]
pub(crate) mod manifest {
    //! The torch reference values of `fixtures/scenarios/conventions.json`.

    /// The parsed manifest (the file is committed; a parse failure is a broken fixture).
    pub fn load() -> serde_json::Value {
        let text = include_str!("../../fixtures/scenarios/conventions.json");
        serde_json::from_str(text).expect("fixtures/scenarios/conventions.json is valid JSON")
    }
}
