//! losscheck's report model: what `--format json` prints and `--output` writes, and what
//! the table and markdown renderers read, so the three never disagree.

use crate::error::{Error, Result};
use crate::judge::infer::Convention;
use crate::judge::{Status, TreeCheck, Verdict};
use crate::kernels::loss::{compute_with_grad, LossConfig, LossInputs, Metrics};
use crate::kernels::{to_f64, to_f64_vec};
pub use crate::model::unreadable::Unreadable;

/// Layout version of the JSON report.
pub const SCHEMA_VERSION: u32 = 1;

/// A losscheck report: the verdicts on a dump tree's cells, or the loss of one `--inputs`
/// file. Serialised without a tag: the two JSON layouts are told apart by their fields.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
pub enum Report {
    /// `--dump-dir`: one verdict per rank/micro cell.
    Tree(TreeReport),
    /// `--inputs`: the loss, its terms, metrics and gradient of free-standing tensors.
    Inputs(InputsReport),
}

impl Report {
    /// True when a cell's dumped loss does not follow from its own inputs (an error-level
    /// finding).
    pub fn inconsistent(&self) -> bool {
        match self {
            Report::Tree(t) => t.verdicts.iter().any(|v| v.status == Status::Inconsistent),
            Report::Inputs(_) => false,
        }
    }

    /// True when a cell's total cannot be judged for want of its coefficients (a
    /// warning-level finding, [`Status::Undetermined`]).
    pub fn undetermined(&self) -> bool {
        match self {
            Report::Tree(t) => t
                .verdicts
                .iter()
                .any(|v| matches!(v.status, Status::Undetermined | Status::CannotJudge)),
            Report::Inputs(_) => false,
        }
    }
}

/// The report on a dump tree.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TreeReport {
    /// Layout version ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// The loss configuration every cell was recomputed with.
    pub preset: LossConfig,
    /// How the step's conventions (aggregation, KL estimator, coefficients) were settled:
    /// flag, dumped, inferred (with the fit) or preset. Empty when not settled per step.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conventions: Vec<Convention>,
    /// One verdict per rank/micro, in rank then micro order.
    pub verdicts: Vec<Verdict>,
    /// Cells left out: forward_data without a loss file (nothing dumped to check).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// The terms that differ in each inconsistent cell ([`Verdict::differs`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub diagnoses: Vec<Diagnosis>,
    /// Dump files that could not be read, with the reason: their cells are left out, every
    /// other cell is judged, and the command exits 2 with this report.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<Unreadable>,
}

/// The terms that differ in one inconsistent cell.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Diagnosis {
    /// Rank.
    pub rank: u32,
    /// Micro-batch.
    pub micro: u32,
    /// The verdict's file.
    pub file: std::path::PathBuf,
    /// `ratio`, `pg`, `aggregation`, `entropy`, `kl`, `mask`, `composition`, `loss`.
    pub differs: Vec<String>,
}

impl TreeReport {
    /// The report on `verdicts` recomputed with `cfg`.
    pub fn new(cfg: &LossConfig, verdicts: Vec<Verdict>) -> Self {
        TreeReport {
            schema_version: SCHEMA_VERSION,
            preset: cfg.clone(),
            conventions: Vec::new(),
            verdicts,
            skipped: Vec::new(),
            diagnoses: Vec::new(),
            unreadable: Vec::new(),
        }
    }

    /// The report of a tree checked under its own conventions.
    pub fn of_check(c: TreeCheck) -> Self {
        TreeReport {
            schema_version: SCHEMA_VERSION,
            preset: c.cfg,
            conventions: c.conventions,
            diagnoses: c
                .verdicts
                .iter()
                .filter(|v| !v.differs.is_empty())
                .map(|v| Diagnosis {
                    rank: v.rank,
                    micro: v.micro,
                    file: v.file.clone(),
                    differs: v.differs.clone(),
                })
                .collect(),
            verdicts: c.verdicts,
            skipped: c.skipped,
            unreadable: Vec::new(),
        }
    }

    /// One line naming the conventions that are not the preset's (`None` when all are).
    pub fn conventions_line(&self) -> Option<String> {
        let shown: Vec<String> = self
            .conventions
            .iter()
            .filter(|c| !c.matches_preset)
            .map(Convention::line)
            .collect();
        (!shown.is_empty()).then(|| format!("conventions: {}", shown.join(", ")))
    }
}

/// The loss of one `--inputs` file. Non-finite numbers are written as JSON `null`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InputsReport {
    /// Layout version ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// The loss configuration.
    pub preset: LossConfig,
    /// The total loss: policy term + KL − entropy bonus.
    pub loss: f64,
    /// The policy-gradient term.
    pub pg_loss: f64,
    /// The KL term, when one is configured.
    pub kl_loss: Option<f64>,
    /// The entropy bonus, when entropy is given.
    pub entropy_loss: Option<f64>,
    /// The frameworks' scalar metrics.
    pub metrics: Metrics,
    /// Shape of the gradient of the loss with respect to the current log-probs.
    pub grad_shape: Vec<usize>,
    /// Every element of that gradient, row-major.
    pub grad: Vec<f64>,
}

impl InputsReport {
    /// Compute the loss of `inputs` under `cfg` and its gradient; `what` names the input
    /// in an error.
    pub fn compute(inputs: &LossInputs, cfg: &LossConfig, what: &std::path::Path) -> Result<Self> {
        let (out, grad) = compute_with_grad(inputs, cfg)
            .map_err(|e| Error::format(what, crate::error::Position::File, e.to_string()))?;
        let scalar = |name: &str, t: &candle_core::Tensor| {
            to_f64(t).map_err(|e| Error::internal(format!("reading the computed {name}: {e}")))
        };
        Ok(InputsReport {
            schema_version: SCHEMA_VERSION,
            preset: cfg.clone(),
            loss: scalar("loss", &out.loss)?,
            pg_loss: scalar("pg_loss", &out.pg_loss)?,
            kl_loss: out
                .kl_loss
                .as_ref()
                .map(|t| scalar("kl_loss", t))
                .transpose()?,
            entropy_loss: out
                .entropy_loss
                .as_ref()
                .map(|t| scalar("entropy_loss", t))
                .transpose()?,
            metrics: out.metrics,
            grad_shape: grad.dims().to_vec(),
            grad: to_f64_vec(&grad)
                .map_err(|e| Error::internal(format!("reading the computed gradient: {e}")))?,
        })
    }
}
