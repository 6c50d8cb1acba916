//! Where a step's mismatch sits: by response-position bucket, by token id, by sequence,
//! by rank × micro, by rank and by group; the share of the total carried by the top 1 %
//! of tokens; and a finding when one token id, one rank or one position range carries it.
//!
//! A token's contribution is `|Δ| = |L − R|`, the absolute log-prob difference (slime's
//! and TRL's measure); shares are of `Σ |Δ|` over the step's scored tokens. A part's
//! *lift* is its share of `Σ |Δ|` over its share of the tokens: 1 when it carries its
//! weight, more when the mismatch concentrates there.

use std::collections::BTreeMap;

use crate::model::finding::{Finding, Severity};

/// Running `|Δ|` statistics of a part of the step.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Acc {
    /// Tokens.
    pub count: u64,
    /// `Σ |Δ|`.
    pub sum_abs: f64,
    /// `Σ Δ` (signed `L − R`).
    pub sum_delta: f64,
    /// `max |Δ|`.
    pub max_abs: f64,
}

impl Default for Acc {
    fn default() -> Self {
        Acc {
            count: 0,
            sum_abs: 0.0,
            sum_delta: 0.0,
            max_abs: 0.0,
        }
    }
}

impl Acc {
    /// Add a token with `Δ = d`.
    #[inline]
    pub fn push(&mut self, d: f64) {
        self.count += 1;
        self.sum_abs += d.abs();
        self.sum_delta += d;
        self.max_abs = self.max_abs.max(d.abs());
    }
    /// Merge another part.
    pub fn merge(&mut self, o: &Acc) {
        self.count += o.count;
        self.sum_abs += o.sum_abs;
        self.sum_delta += o.sum_delta;
        self.max_abs = self.max_abs.max(o.max_abs);
    }
}

/// One sequence (row) of the step.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SeqRecord {
    /// Rank.
    pub rank: usize,
    /// Micro-batch.
    pub micro: Option<usize>,
    /// Row within the cell.
    pub row: usize,
    /// Tokens compared (the response length under the mask).
    pub tokens: u64,
    /// Scalar reward, when dumped.
    pub reward: Option<f64>,
    /// Group id, when dumped.
    pub group: Option<String>,
    /// Sample id, when dumped.
    pub sample: Option<String>,
    /// `Σ |Δ|`.
    pub sum_abs: f64,
    /// `Σ |Δ| / tokens`.
    pub mean_abs: f64,
    /// `Σ Δ`, the log of the sequence importance weight.
    pub sum_delta: f64,
    /// `max |Δ|` and the response position where it is.
    pub max_abs: f64,
    /// Response position of the largest `|Δ|`.
    pub max_at: Option<usize>,
}

/// The `k` largest values pushed so far (kept in at most `2k`, cut back with a linear
/// selection): the exact top-1 % share without sorting the step.
#[derive(Debug, Clone, Default)]
pub struct TopK {
    k: usize,
    vals: Vec<f64>,
}

impl TopK {
    /// Keep the `k` largest.
    pub fn new(k: usize) -> Self {
        TopK {
            k,
            vals: Vec::new(),
        }
    }
    fn cut(&mut self, k: usize) {
        if self.vals.len() > k {
            if k == 0 {
                self.vals.clear();
                return;
            }
            self.vals
                .select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
            self.vals.truncate(k);
        }
    }
    /// Add values.
    pub fn extend(&mut self, v: &[f64]) {
        self.vals.extend_from_slice(v);
        if self.vals.len() > 2 * self.k.max(1) {
            self.cut(self.k);
        }
    }
    /// Merge another keeper.
    pub fn merge(&mut self, o: TopK) {
        self.k = self.k.max(o.k);
        self.extend(&o.vals);
    }
    /// The smallest value that can still enter the top `k` (0 until `k` values are kept):
    /// a scan may drop smaller values before pushing them.
    pub fn floor(&mut self) -> f64 {
        if self.vals.len() < self.k || self.k == 0 {
            return 0.0;
        }
        self.cut(self.k);
        self.vals.iter().copied().fold(f64::INFINITY, f64::min)
    }
    /// The sum of the `k ≤ self.k` largest values kept.
    pub fn sum_top(mut self, k: usize) -> f64 {
        self.cut(k);
        self.vals.sort_by(|a, b| b.total_cmp(a));
        self.vals.iter().sum()
    }
}

/// A part's share of the step's mismatch.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Share {
    /// What the part is (`positions 512..1024`, `token 1234`, `rank 3`, `group g7`).
    pub key: String,
    /// Its statistics.
    pub acc: Acc,
    /// `Σ |Δ|` of the part over the step's.
    pub share: f64,
    /// Its tokens over the step's.
    pub token_share: f64,
    /// `share / token_share`.
    pub lift: f64,
    /// Mean `|Δ|` over its tokens.
    pub mean_abs: f64,
}

fn share(key: String, acc: Acc, total: &Acc) -> Share {
    let s = acc.sum_abs / total.sum_abs;
    let ts = acc.count as f64 / total.count as f64;
    Share {
        key,
        acc,
        share: s,
        token_share: ts,
        lift: s / ts,
        mean_abs: acc.sum_abs / acc.count as f64,
    }
}

/// The attribution section of a report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Attribution {
    /// The whole step.
    pub total: Acc,
    /// Width of a position bucket, in response tokens.
    pub bucket_width: usize,
    /// Every position bucket in order (`first..last` response positions).
    pub by_position: Vec<Share>,
    /// The token ids carrying most of `Σ |Δ|`, largest first.
    pub top_tokens: Vec<Share>,
    /// Distinct token ids seen (0 when no ids were dumped).
    pub distinct_tokens: usize,
    /// The sequences with the largest `Σ |Δ|`, largest first.
    pub worst_sequences: Vec<SeqRecord>,
    /// Every rank × micro cell, in order.
    pub by_cell: Vec<Share>,
    /// Every rank, in order.
    pub by_rank: Vec<Share>,
    /// The groups carrying most of `Σ |Δ|` (when groups were dumped), largest first.
    pub top_groups: Vec<Share>,
    /// Tokens in the top 1 % (`ceil(tokens / 100)`).
    pub top1pct_tokens: u64,
    /// The share of `Σ |Δ|` those tokens carry.
    pub top1pct_share: f64,
}

/// Thresholds of the concentration findings (what they mean is in docs/mismatch.md).
pub mod thresholds {
    /// A token id is flagged when it carries at least this share of `Σ |Δ|` …
    pub const TOKEN_SHARE: f64 = 0.2;
    /// … with at least this lift …
    pub const TOKEN_LIFT: f64 = 5.0;
    /// … over at least this many occurrences.
    pub const TOKEN_MIN_COUNT: u64 = 3;
    /// A rank is flagged when its lift is at least `min(RANK_LIFT, 0.9 · ranks)`.
    pub const RANK_LIFT: f64 = 2.0;
    /// A position range (adjacent buckets each with lift ≥ `POSITION_LIFT`) is flagged
    /// when it carries at least `POSITION_SHARE` of `Σ |Δ|` with at most half the tokens,
    /// among at least `POSITION_MIN_BUCKETS` buckets.
    pub const POSITION_LIFT: f64 = 2.0;
    /// See [`POSITION_LIFT`].
    pub const POSITION_SHARE: f64 = 0.3;
    /// See [`POSITION_LIFT`].
    pub const POSITION_MIN_BUCKETS: usize = 4;
}

/// Token ids below this are counted in a dense table (a vocabulary); others in a map.
pub const DENSE_IDS: i64 = 1 << 22;

/// `|Δ|` statistics per token id: a dense table for ids below a limit set by the cell's
/// size (a vocabulary, when the cell is large enough to fill it), a map for the rest.
#[derive(Debug, Clone, Default)]
pub struct TokenAccs {
    dense: Vec<Acc>,
    limit: i64,
    sparse: crate::logs::fastline::FxMap<i64, Acc>,
}

impl TokenAccs {
    /// A table for a cell of `tokens` tokens: ids below `min(DENSE_IDS, max(4096, 2 ·
    /// tokens))` are counted densely.
    pub fn for_tokens(tokens: usize) -> Self {
        TokenAccs {
            limit: DENSE_IDS.min((2 * tokens as i64).max(4096)),
            ..TokenAccs::default()
        }
    }
    /// Add a token `id` with `Δ = d`.
    #[inline]
    pub fn push(&mut self, id: i64, d: f64) {
        if (0..self.limit).contains(&id) {
            let i = id as usize;
            if i >= self.dense.len() {
                self.dense
                    .resize((i + 1).next_power_of_two(), Acc::default());
            }
            self.dense[i].push(d);
        } else {
            self.sparse.entry(id).or_default().push(d);
        }
    }
    /// Merge another table.
    pub fn merge(&mut self, o: TokenAccs) {
        self.limit = self.limit.max(o.limit);
        if self.dense.len() < o.dense.len() {
            self.dense.resize(o.dense.len(), Acc::default());
        }
        for (a, b) in self.dense.iter_mut().zip(&o.dense) {
            if b.count > 0 {
                a.merge(b);
            }
        }
        for (id, acc) in o.sparse {
            self.sparse.entry(id).or_default().merge(&acc);
        }
    }
    /// Every id seen with its statistics.
    pub fn into_vec(mut self) -> Vec<(i64, Acc)> {
        // An id counted sparsely in one cell and densely in another: one entry.
        let mut rest = Vec::new();
        for (id, acc) in std::mem::take(&mut self.sparse) {
            match usize::try_from(id).ok().filter(|i| *i < self.dense.len()) {
                Some(i) => self.dense[i].merge(&acc),
                None => rest.push((id, acc)),
            }
        }
        let mut v: Vec<(i64, Acc)> = self
            .dense
            .into_iter()
            .enumerate()
            .filter(|(_, a)| a.count > 0)
            .map(|(i, a)| (i as i64, a))
            .collect();
        v.extend(rest);
        v
    }
}

/// Everything the scan gathers for attribution, merged over cells.
#[derive(Debug, Clone, Default)]
pub struct Gathered {
    /// Per position bucket.
    pub buckets: Vec<Acc>,
    /// Per token id.
    pub tokens: TokenAccs,
    /// Per cell, in (rank, micro) order.
    pub cells: Vec<((usize, Option<usize>), Acc)>,
    /// Every sequence.
    pub seqs: Vec<SeqRecord>,
    /// The largest `|Δ|` values.
    pub top: TopK,
}

impl Gathered {
    /// Merge another cell's (cells must come in (rank, micro) order).
    pub fn merge(&mut self, o: Gathered) {
        if self.buckets.len() < o.buckets.len() {
            self.buckets.resize(o.buckets.len(), Acc::default());
        }
        for (a, b) in self.buckets.iter_mut().zip(&o.buckets) {
            a.merge(b);
        }
        self.tokens.merge(o.tokens);
        self.cells.extend(o.cells);
        self.seqs.extend(o.seqs);
        self.top.merge(o.top);
    }

    /// The attribution and its findings, keeping the `top_n` largest of each list.
    pub fn finish(self, width: usize, top_n: usize, step: i64) -> (Attribution, Vec<Finding>) {
        let mut total = Acc::default();
        for (_, a) in &self.cells {
            total.merge(a);
        }
        let by_position: Vec<Share> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, a)| {
                share(
                    format!("{}..{}", i * width, (i + 1) * width - 1),
                    *a,
                    &total,
                )
            })
            .collect();
        let mut tokens: Vec<(i64, Acc)> = self.tokens.into_vec();
        let distinct_tokens = tokens.len();
        tokens.sort_by(|x, y| y.1.sum_abs.total_cmp(&x.1.sum_abs).then(x.0.cmp(&y.0)));
        let top_tokens: Vec<Share> = tokens
            .iter()
            .take(top_n)
            .map(|(id, a)| share(format!("{id}"), *a, &total))
            .collect();
        let by_cell: Vec<Share> = self
            .cells
            .iter()
            .map(|((r, m), a)| {
                let key = match m {
                    Some(m) => format!("rank {r} micro {m}"),
                    None => format!("rank {r}"),
                };
                share(key, *a, &total)
            })
            .collect();
        let mut ranks: BTreeMap<usize, Acc> = BTreeMap::new();
        for ((r, _), a) in &self.cells {
            ranks.entry(*r).or_default().merge(a);
        }
        let by_rank: Vec<Share> = ranks
            .iter()
            .map(|(r, a)| share(format!("rank {r}"), *a, &total))
            .collect();
        let mut groups: BTreeMap<String, Acc> = BTreeMap::new();
        for s in &self.seqs {
            if let Some(g) = &s.group {
                let e = groups.entry(g.clone()).or_default();
                e.count += s.tokens;
                e.sum_abs += s.sum_abs;
                e.sum_delta += s.sum_delta;
                e.max_abs = e.max_abs.max(s.max_abs);
            }
        }
        let mut top_groups: Vec<Share> = groups
            .into_iter()
            .map(|(g, a)| share(format!("group {g}"), a, &total))
            .collect();
        top_groups.sort_by(|a, b| b.acc.sum_abs.total_cmp(&a.acc.sum_abs));
        top_groups.truncate(top_n);
        let mut seqs = self.seqs;
        seqs.sort_by(|a, b| b.sum_abs.total_cmp(&a.sum_abs));
        seqs.truncate(top_n);
        let k = total.count.div_ceil(100);
        let top1pct_share = self.top.sum_top(k as usize) / total.sum_abs;
        let att = Attribution {
            total,
            bucket_width: width,
            by_position,
            top_tokens,
            distinct_tokens,
            worst_sequences: seqs,
            by_cell,
            by_rank,
            top_groups,
            top1pct_tokens: k,
            top1pct_share,
        };
        let findings = concentration_findings(&att, step);
        (att, findings)
    }
}

fn evidence(pairs: &[(&str, serde_json::Value)]) -> serde_json::Map<String, serde_json::Value> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// The findings of [`thresholds`]: one token id, one rank, one position range.
fn concentration_findings(a: &Attribution, step: i64) -> Vec<Finding> {
    use thresholds::*;
    let mut out = Vec::new();
    if a.total.sum_abs <= 0.0 || !a.total.sum_abs.is_finite() {
        return out;
    }
    for t in &a.top_tokens {
        if t.share >= TOKEN_SHARE && t.lift >= TOKEN_LIFT && t.acc.count >= TOKEN_MIN_COUNT {
            let mut f = Finding::new(
                "mismatch-token",
                Severity::Warning,
                vec![step],
                format!(
                    "token id {} carries {:.1}% of the step's |Δlogp| with {:.2}% of its tokens ({} occurrences, mean |Δ| {:.3e})",
                    t.key,
                    100.0 * t.share,
                    100.0 * t.token_share,
                    t.acc.count,
                    t.mean_abs
                ),
                &[
                    "a token the engine and the trainer tokenise or score differently (special / chat-template tokens)",
                    "a kernel difference on that token's logits (sampling-side logit processing, temperature applied on one side)",
                ],
            );
            f.evidence = evidence(&[
                (
                    "token_id",
                    t.key
                        .parse::<i64>()
                        .map(Into::into)
                        .unwrap_or(serde_json::Value::Null),
                ),
                ("share", t.share.into()),
                ("lift", t.lift.into()),
                ("count", t.acc.count.into()),
            ]);
            out.push(f);
        }
    }
    let nr = a.by_rank.len() as f64;
    if nr >= 2.0 {
        let need = RANK_LIFT.min(0.9 * nr);
        for r in &a.by_rank {
            if r.lift >= need {
                let mut f = Finding::new(
                    "mismatch-rank",
                    Severity::Warning,
                    vec![step],
                    format!(
                        "{} carries {:.1}% of the step's |Δlogp| with {:.1}% of its tokens (lift {:.2})",
                        r.key,
                        100.0 * r.share,
                        100.0 * r.token_share,
                        r.lift
                    ),
                    &[
                        "that rank's weights differ from the engine's (a failed or partial weight sync)",
                        "a different kernel, dtype or parallel layout on that rank",
                    ],
                );
                f.evidence = evidence(&[
                    (
                        "rank",
                        r.key
                            .trim_start_matches("rank ")
                            .parse::<u64>()
                            .map(Into::into)
                            .unwrap_or(serde_json::Value::Null),
                    ),
                    ("share", r.share.into()),
                    ("lift", r.lift.into()),
                ]);
                out.push(f);
            }
        }
    }
    let b = &a.by_position;
    if b.len() >= POSITION_MIN_BUCKETS {
        // The longest run of adjacent buckets with lift ≥ POSITION_LIFT carrying the most.
        let mut best: Option<(usize, usize, f64, f64)> = None;
        let mut i = 0;
        while i < b.len() {
            if b[i].lift >= POSITION_LIFT && b[i].acc.count > 0 {
                let j0 = i;
                let (mut s, mut ts) = (0.0, 0.0);
                while i < b.len() && b[i].lift >= POSITION_LIFT && b[i].acc.count > 0 {
                    s += b[i].share;
                    ts += b[i].token_share;
                    i += 1;
                }
                if best.is_none_or(|x| s > x.2) {
                    best = Some((j0, i - 1, s, ts));
                }
            } else {
                i += 1;
            }
        }
        if let Some((j0, j1, s, ts)) = best {
            if s >= POSITION_SHARE && ts <= 0.5 {
                let (lo, hi) = (j0 * a.bucket_width, (j1 + 1) * a.bucket_width - 1);
                let mut f = Finding::new(
                    "mismatch-position",
                    Severity::Warning,
                    vec![step],
                    format!(
                        "response positions {lo}..{hi} carry {:.1}% of the step's |Δlogp| with {:.1}% of its tokens",
                        100.0 * s,
                        100.0 * ts
                    ),
                    &[
                        "long-context numerics (RoPE scaling, attention kernel precision) differ between engine and trainer",
                        "a KV-cache or prefix-cache difference from that position on",
                    ],
                );
                f.evidence = evidence(&[
                    ("first_position", lo.into()),
                    ("last_position", hi.into()),
                    ("share", s.into()),
                    ("token_share", ts.into()),
                ]);
                out.push(f);
            }
        }
    }
    out
}
