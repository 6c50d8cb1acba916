//! Compare two dumps of one step whatever their producers' layouts (issue 29): two runs
//! of one stack, two backends, two stacks on one config. Reads only [`StepDump`]s.
//!
//! Rows are matched by content: each row's response token ids (through
//! [`TokenBatch::response_tokens`], so response columns and whole-sequence columns line
//! up), equal responses paired in order. Log-probs are matched by meaning — engine
//! against engine, trainer-old against trainer-old ([`LogProbSource`]) — whatever each
//! stack calls them; then advantages, entropy and the rows' scalar rewards. The report
//! names the first difference beyond the tolerance at its rank / micro / row / position
//! on both sides, and what could not be compared (roles one side lacks, rows without
//! token ids).

use std::collections::{BTreeMap, HashMap};

use crate::model::step::{LogProbSource, StepDump, TokenBatch, TokenTensor};

/// How close two values must be: `|a − b| ≤ atol + rtol·|b|` (both 0: bit-equal in f64).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Closeness {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Closeness {
    fn close(&self, a: f64, b: f64) -> bool {
        a == b || (a - b).abs() <= self.atol + self.rtol * b.abs() || (a.is_nan() && b.is_nan())
    }
}

/// Where a row sits in its side.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RowAt {
    /// Data-parallel rank.
    pub rank: usize,
    /// Micro-batch, `None` for a whole-batch cell.
    pub micro: Option<usize>,
    /// Row within the cell.
    pub row: usize,
}

impl std::fmt::Display for RowAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.micro {
            Some(m) => write!(f, "rank {} micro {} row {}", self.rank, m, self.row),
            None => write!(f, "rank {} row {}", self.rank, self.row),
        }
    }
}

/// The first difference found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Difference {
    /// What differs (`log_probs[old]`, `advantages`, `reward`, `response length`).
    pub quantity: String,
    /// The row on side A.
    pub a: RowAt,
    /// The row on side B.
    pub b: RowAt,
    /// Response token index (0 = first response token); `None` for a per-row value.
    pub position: Option<usize>,
    /// Side A's value.
    pub a_value: f64,
    /// Side B's value.
    pub b_value: f64,
}

/// One quantity compared over every matched row.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct QuantityResult {
    /// Its name.
    pub quantity: String,
    /// Elements compared.
    pub compared: usize,
    /// Elements beyond the tolerance.
    pub differing: usize,
    /// Largest |a − b|.
    pub max_abs_diff: f64,
}

/// The comparison of two sides of one step.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelCompareReport {
    /// The step compared.
    pub step: i64,
    /// Side A's producer and folder.
    pub a: (String, String),
    /// Side B's producer and folder.
    pub b: (String, String),
    /// Rows matched by their response tokens.
    pub rows_matched: usize,
    /// Rows of A with no match in B (where they are).
    pub only_a: Vec<RowAt>,
    /// Rows of B with no match in A.
    pub only_b: Vec<RowAt>,
    /// Rows of either side without token ids (cannot be matched).
    pub rows_without_tokens: usize,
    /// Each quantity compared.
    pub quantities: Vec<QuantityResult>,
    /// Quantities one side dumps and the other does not (named with the side holding it).
    pub not_compared: Vec<String>,
    /// The first difference (in A's row order), if any.
    pub first_difference: Option<Difference>,
    /// The tolerance used.
    pub closeness: Closeness,
}

impl ModelCompareReport {
    /// Whether the sides agree on everything they both dumped and every row matched.
    pub fn clean(&self) -> bool {
        self.first_difference.is_none()
            && self.only_a.is_empty()
            && self.only_b.is_empty()
            && self.rows_matched > 0
    }

    /// The report as text lines (the CLI prints it; `--format json` prints the report).
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "step {}: A = {} ({}), B = {} ({})\n",
            self.step, self.a.0, self.a.1, self.b.0, self.b.1
        );
        s.push_str(&format!(
            "rows: {} matched by response tokens, {} only in A, {} only in B, {} without token ids\n",
            self.rows_matched,
            self.only_a.len(),
            self.only_b.len(),
            self.rows_without_tokens
        ));
        for q in &self.quantities {
            s.push_str(&format!(
                "  {:<22} {:>7} compared  {:>5} differ  max |a-b| {:.3e}\n",
                q.quantity, q.compared, q.differing, q.max_abs_diff
            ));
        }
        for n in &self.not_compared {
            s.push_str(&format!("  not compared: {n}\n"));
        }
        for r in self.only_a.iter().take(5) {
            s.push_str(&format!("  only in A: {r}\n"));
        }
        for r in self.only_b.iter().take(5) {
            s.push_str(&format!("  only in B: {r}\n"));
        }
        match &self.first_difference {
            Some(d) => s.push_str(&format!(
                "FIRST DIFFERENCE: {} at A {} / B {}{}: A {} vs B {} (|a-b| {:.3e})\n",
                d.quantity,
                d.a,
                d.b,
                d.position
                    .map(|p| format!(", response token {p}"))
                    .unwrap_or_default(),
                d.a_value,
                d.b_value,
                (d.a_value - d.b_value).abs()
            )),
            None if self.clean() => s.push_str("SAME: every quantity both sides dumped agrees\n"),
            None => s.push_str("DIFFERENT: rows do not match\n"),
        }
        s
    }
}

/// One row of a side: where it is and its batch.
struct Row<'d> {
    at: RowAt,
    batch: &'d TokenBatch,
    index: usize,
}

fn rows_of(d: &StepDump) -> (Vec<(Vec<i64>, Row<'_>)>, usize) {
    let mut out = Vec::new();
    let mut missing = 0;
    for c in &d.cells {
        for i in 0..c.batch.row_count() {
            let at = RowAt {
                rank: c.rank,
                micro: c.micro,
                row: i,
            };
            match c.batch.response_tokens(i) {
                Some(t) => out.push((
                    t,
                    Row {
                        at,
                        batch: &c.batch,
                        index: i,
                    },
                )),
                None => missing += 1,
            }
        }
    }
    (out, missing)
}

/// The per-token quantities compared, by name, and how to get each from a batch.
fn per_token(b: &TokenBatch) -> BTreeMap<String, &TokenTensor> {
    let mut m: BTreeMap<String, &TokenTensor> = BTreeMap::new();
    for (role, t) in &b.log_probs {
        m.insert(format!("log_probs[{}]", role_name(*role)), t);
    }
    if let Some(t) = &b.advantages {
        m.insert("advantages".into(), t);
    }
    if let Some(t) = &b.entropy {
        m.insert("entropy".into(), t);
    }
    m
}

/// The model's name of a role (`rollout`, `old`, `current`, `reference`).
pub fn role_name(r: LogProbSource) -> &'static str {
    r.name()
}

/// Compare sides `a` and `b` (two [`StepDump`]s of one step).
pub fn compare(a: &StepDump, b: &StepDump, closeness: Closeness) -> ModelCompareReport {
    let (ra, miss_a) = rows_of(a);
    let (rb, miss_b) = rows_of(b);
    let mut pool: HashMap<&[i64], Vec<usize>> = HashMap::new();
    for (j, (t, _)) in rb.iter().enumerate().rev() {
        pool.entry(t.as_slice()).or_default().push(j);
    }
    let mut pairs = Vec::new();
    let mut only_a = Vec::new();
    for (t, r) in &ra {
        match pool.get_mut(t.as_slice()).and_then(Vec::pop) {
            Some(j) => pairs.push((r, &rb[j].1)),
            None => only_a.push(r.at.clone()),
        }
    }
    let mut only_b: Vec<RowAt> = pool
        .values()
        .flatten()
        .map(|&j| rb[j].1.at.clone())
        .collect();
    only_b.sort_by_key(|r| (r.rank, r.micro, r.row));

    let names_a: Vec<String> = a
        .cells
        .iter()
        .flat_map(|c| per_token(&c.batch).into_keys())
        .collect();
    let names_b: Vec<String> = b
        .cells
        .iter()
        .flat_map(|c| per_token(&c.batch).into_keys())
        .collect();
    let mut not_compared: Vec<String> = Vec::new();
    for n in &names_a {
        if !names_b.contains(n) && !not_compared.iter().any(|x| x.starts_with(n.as_str())) {
            not_compared.push(format!("{n} (only A dumps it)"));
        }
    }
    for n in &names_b {
        if !names_a.contains(n) && !not_compared.iter().any(|x| x.starts_with(n.as_str())) {
            not_compared.push(format!("{n} (only B dumps it)"));
        }
    }
    let mut results: BTreeMap<String, QuantityResult> = BTreeMap::new();
    let mut first: Option<Difference> = None;
    let mut note = |q: &str,
                    ra: &Row,
                    rb: &Row,
                    pos: Option<usize>,
                    x: f64,
                    y: f64,
                    first: &mut Option<Difference>| {
        let e = results
            .entry(q.to_string())
            .or_insert_with(|| QuantityResult {
                quantity: q.to_string(),
                compared: 0,
                differing: 0,
                max_abs_diff: 0.0,
            });
        e.compared += 1;
        let d = (x - y).abs();
        if d > e.max_abs_diff || d.is_nan() {
            e.max_abs_diff = d;
        }
        if !closeness.close(x, y) {
            e.differing += 1;
            if first.is_none() {
                *first = Some(Difference {
                    quantity: q.to_string(),
                    a: ra.at.clone(),
                    b: rb.at.clone(),
                    position: pos,
                    a_value: x,
                    b_value: y,
                });
            }
        }
    };
    for (ra, rb) in &pairs {
        let (qa, qb) = (per_token(ra.batch), per_token(rb.batch));
        for (name, ta) in &qa {
            let Some(tb) = qb.get(name) else { continue };
            let (Some(va), Some(vb)) = (
                ra.batch.response_values(ta, ra.index),
                rb.batch.response_values(tb, rb.index),
            ) else {
                continue;
            };
            for (p, (x, y)) in va.iter().zip(&vb).enumerate() {
                note(name, ra, rb, Some(p), *x, *y, &mut first);
            }
        }
        let ma = ra.batch.rows.get(ra.index);
        let mb = rb.batch.rows.get(rb.index);
        if let (Some(x), Some(y)) = (ma.and_then(|m| m.reward), mb.and_then(|m| m.reward)) {
            note("reward", ra, rb, None, x, y, &mut first);
        }
    }
    ModelCompareReport {
        step: a.step,
        a: (a.producer.clone(), a.root.display().to_string()),
        b: (b.producer.clone(), b.root.display().to_string()),
        rows_matched: pairs.len(),
        only_a,
        only_b,
        rows_without_tokens: miss_a + miss_b,
        quantities: results.into_values().collect(),
        not_compared,
        first_difference: first,
        closeness,
    }
}
