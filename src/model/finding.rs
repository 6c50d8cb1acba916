//! A finding: one detected signature with its evidence, and the one severity scale every
//! tool's `--fail-on` compares against.

use crate::json::json_num;

/// How bad a finding is; `--fail-on` compares against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing, not a problem by itself.
    Info,
    /// Likely a problem; look at it.
    Warning,
    /// The run is not learning or is wrong.
    Error,
    /// The numbers are broken (NaN/inf).
    Critical,
}

impl Severity {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
            Severity::Critical => "critical",
        }
    }
}

/// One detected signature with its evidence.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    /// Detector name (its flag without `--`).
    pub detector: String,
    /// Severity.
    pub severity: Severity,
    /// First step involved.
    pub first_step: Option<i64>,
    /// Last step involved.
    pub last_step: Option<i64>,
    /// Steps involved (at most [`MAX_STEPS_LISTED`]).
    pub steps: Vec<i64>,
    /// Number of steps (or events) involved.
    pub count: usize,
    /// Named evidence values.
    pub evidence: serde_json::Map<String, serde_json::Value>,
    /// One line saying what was seen.
    pub explanation: String,
    /// Likely causes, most likely first (from the seeds' experience).
    pub likely_causes: Vec<String>,
    /// The run (0-based) of a log holding several appended runs; absent for one run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<u32>,
}

/// Most steps listed in a finding.
pub const MAX_STEPS_LISTED: usize = 50;

impl Finding {
    /// A finding over `steps` (sorted, deduplicated here).
    pub fn new(
        detector: &str,
        severity: Severity,
        mut steps: Vec<i64>,
        explanation: impl Into<String>,
        causes: &[&str],
    ) -> Self {
        steps.sort_unstable();
        steps.dedup();
        let count = steps.len();
        let first_step = steps.first().copied();
        let last_step = steps.last().copied();
        steps.truncate(MAX_STEPS_LISTED);
        Finding {
            detector: detector.to_string(),
            severity,
            first_step,
            last_step,
            steps,
            count,
            evidence: serde_json::Map::new(),
            explanation: explanation.into(),
            likely_causes: causes.iter().map(|c| c.to_string()).collect(),
            run: None,
        }
    }

    /// Add a numeric evidence value (NaN/inf written as strings, JSON has no NaN).
    pub fn num(mut self, name: &str, v: f64) -> Self {
        self.evidence.insert(name.to_string(), json_num(v));
        self
    }

    /// Add any evidence value.
    pub fn with(mut self, name: &str, v: impl Into<serde_json::Value>) -> Self {
        self.evidence.insert(name.to_string(), v.into());
        self
    }

    /// The step range as text: `12`, `12–40`, or `-`.
    pub fn step_range(&self) -> String {
        match (self.first_step, self.last_step) {
            (Some(a), Some(b)) if a == b => a.to_string(),
            (Some(a), Some(b)) => format!("{a}–{b}"),
            _ => "-".to_string(),
        }
    }
}
