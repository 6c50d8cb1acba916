//! The comparison sections: each turns the values read for one rank × micro cell (or the
//! whole batch) into typed [`Comparison`]s. Reference side = self-hosted ("a"), other = "b".
//!
//! Split by concern (private files, re-exported here): `side` (one side's files), `rows`
//! (decoded tensors, row pairing), `engine` (one comparison), `cells`, `ratio_chain` and
//! `loss_cells` (the cells of each section).

use std::borrow::Cow;
use std::cell::{OnceCell, RefCell};
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Mutex;

use rayon::prelude::*;

use crate::compare::align::{match_rows_by, strip_pad_range, RowMatch};
use crate::compare::metrics::{
    effective_dtype, Accumulator, ElemLoc, GridScan, PairMetrics, Positions,
};
use crate::compare::propagate::{self, ChainStats, ElemRun};
use crate::compare::tolerance::{coarser, Tolerance, TolerancePolicy, Verdict};
pub use crate::dumpdiff::mat::Mat;
use crate::dumpdiff::mat::CHUNK;
use crate::dumpdiff::report::{Cell, Comparison, Origin, RowSummary};
use crate::dumpdiff::Progress;
use crate::error::Result;
use crate::kernels::aggregate::AggMode;
use crate::model::conventions::Conventions;
use crate::model::record::{Field, Number, Record};
use crate::model::step::LossRecord;
use crate::model::tokens::tokens_hash;
use crate::model::trajectory::{DatumBatch, TrajectoryBatch};
use crate::model::tree::{DumpFile, DumpTree, Kind};
use crate::tensor::{DType, Tensor};

mod cells;
mod clip_band;
mod clip_fraction;
mod elem_loss;
mod engine;
mod loss_cells;
#[cfg(test)]
mod loss_tests;
mod ratio_chain;
mod rows;
mod shift;
mod side;
mod surrogate;
#[cfg(test)]
mod tests;
mod tis;
mod weights;

pub use cells::*;
use clip_band::clip_band;
pub use clip_band::{note_clip_band, ClipBand};
pub use clip_fraction::{clip_fractions, clip_fractions_by_level, clip_fractions_settled};
use clip_fraction::{dual_read, range_words};
pub use engine::*;
pub use loss_cells::*;
pub use ratio_chain::*;
pub use rows::*;
pub use side::*;
pub use surrogate::{cannot_judge, settle_ratio_level, unattributed, SequenceAlt};
use surrogate::{
    clip_bound_blurred, confirmed, elem_convention, name_clip_bound, own_convention,
    own_convention_dumped, sequence_alt, ElemLoss,
};
pub use tis::{
    agg_in_loss, agg_unseen_in_loss, agg_unseen_words, note_rejection, rejection_elsewhere, OWN_AGG,
};
use tis::{tis_fit, Tis};
pub use weights::{mask_moves_totals, masks_differ, own_sum_fails, totals_cannot_judge, Weights};
