//! losscheck: one dump tree's loss recomputed from its own dumped inputs, cell by cell,
//! and reported — the tool over [`crate::judge`], which does the recomputing (and which
//! dumpdiff and postmortem use too). The report model is [`report`]; the judge's entry
//! points are re-exported here under the names the command line and the tests use.

pub mod report;
pub mod stacks;

pub use crate::judge::{
    cell, check_tree, check_tree_inferred, infer, inputs_from_value, layout_of, overrides,
    self_consistency, self_consistency_any, self_consistency_self_hosted, self_hosted, terms,
    CellId, Divergence, Layout, ScalarCheck, SelfHostedStep, Status, StepCheck, Tolerance,
    TreeCheck, Verdict,
};
