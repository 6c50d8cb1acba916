//! One cell's files with their tensors decoded once, and the pairing of their rows by
//! token content.

use super::*;

/// One parsed file of a cell with its tensors decoded on first use, each once: a cell's
/// comparisons and its derived chain share the decoded matrices, token rows and row
/// pairings. Lives inside one cell's task (not `Send`).
pub struct Tensors<'v> {
    record: &'v Record,
    mats: RefCell<HashMap<Field, Option<Rc<Mat>>>>,
    tokens: OnceCell<Option<Rc<TokenRows>>>,
    /// Content pairings with other files of the cell, by the other file's address.
    pairings: RefCell<Vec<(*const Record, Rc<RowMatch>)>>,
    /// The last comparison of this file's `log_probs` (see [`PairCtx::logprobs_memo`]).
    pub(super) logprobs: RefCell<Option<LogprobMemo>>,
    /// Per row, how far its per-token tensors were moved left by [`Tensors::realign`].
    shifts: RefCell<Option<Rc<Vec<usize>>>>,
}

/// A comparison of a reference file's `log_probs` (under its `response_mask`): what it
/// was compared with, and the result.
pub(super) struct LogprobMemo {
    pub(super) b: Rc<Mat>,
    pub(super) mask_b: Option<Rc<Mat>>,
    pub(super) rows: Rc<RowMatch>,
    /// atol and rtol, bit for bit.
    pub(super) tol: (u64, u64),
    pub(super) metrics: PairMetrics,
}

impl<'v> Tensors<'v> {
    /// Wrap a record; nothing is decoded yet.
    pub fn new(record: &'v Record) -> Self {
        Tensors {
            record,
            mats: RefCell::new(HashMap::new()),
            tokens: OnceCell::new(),
            pairings: RefCell::new(Vec::new()),
            logprobs: RefCell::new(None),
            shifts: RefCell::new(None),
        }
    }

    /// Move row `r` of each per-token tensor `keys` `shifts[r]` positions left, so that its
    /// first valid position lands where the other side's paired row has its own: NexRL's
    /// self-hosted trainer keeps a 1-token prompt and puts the rest of the sequence (the
    /// real prompt, masked) into the response-width tensors
    /// (`nexrl/trainer/self_hosted_trainer.py` `_process_trajectories`, nex-agi/NexRL@6860191),
    /// a weaver or verl layout starts them at the response.
    pub fn realign(&self, fields: &[Field], shifts: Vec<usize>) {
        for &f in fields {
            if let Some(m) = self.mat(f) {
                let mut moved = m.shifted_left(&shifts);
                if m.dtype == DType::F64 {
                    // the values under the mask move with it: their precision stays
                    moved = moved.with_precision(m.precision());
                }
                let moved = Rc::new(moved);
                self.mats.borrow_mut().insert(f, Some(moved));
            }
        }
        *self.shifts.borrow_mut() = Some(Rc::new(shifts));
    }

    /// The per-row shifts [`Tensors::realign`] applied, if any.
    pub fn shifts(&self) -> Option<Rc<Vec<usize>>> {
        self.shifts.borrow().clone()
    }

    /// Per reference row, how far its first valid position (`mask_key`) lies past that of
    /// the `other` row it pairs with by content (`ids`): `None` when no row is shifted, a
    /// paired row's valid count differs, or a reference row starts before its pair.
    pub fn layout_shifts(
        &self,
        ids: &Tensors<'_>,
        other: &Tensors<'_>,
        mask_key: Field,
    ) -> Option<Vec<usize>> {
        let rows = self.content_rows(ids)?;
        let (ma, mb) = (self.mat(mask_key)?, other.mat(mask_key)?);
        let mut shifts = vec![0; ma.rows];
        for &(ra, rb) in &rows.pairs {
            let (va, vb) = (ma.nonzero(ra), mb.nonzero(rb));
            let count = |v: &[std::ops::Range<usize>]| v.iter().map(|r| r.len()).sum::<usize>();
            let (Some(fa), Some(fb)) = (va.first(), vb.first()) else {
                continue;
            };
            if count(va) != count(vb) || fa.start < fb.start {
                return None;
            }
            *shifts.get_mut(ra)? = fa.start - fb.start;
        }
        shifts.iter().any(|s| *s > 0).then_some(shifts)
    }

    /// The record.
    pub fn record(&self) -> &'v Record {
        self.record
    }

    /// [`Mat::of`] the tensor of `field`, decoded on the first call.
    pub fn mat(&self, field: Field) -> Option<Rc<Mat>> {
        if let Some(m) = self.mats.borrow().get(&field) {
            return m.clone();
        }
        let m = Mat::of(self.record, field).map(|m| Rc::new(self.under_mask(field, m)));
        self.mats.borrow_mut().insert(field, m.clone());
        m
    }

    /// A `.jsonl` dump (or an f64 tensor) states no finer dtype: its per-token values'
    /// precision is read off the values under the file's `response_mask` only, since padding is nobody's numbers and
    /// f64 junk there must not make bf16 log-probs "f64" (issue 28, metamorphic checks).
    fn under_mask(&self, field: Field, m: Mat) -> Mat {
        if m.dtype != DType::F64 || field == Field::ResponseMask {
            return m;
        }
        let Some(mask) = self.mat(Field::ResponseMask).filter(|k| k.shape == m.shape) else {
            return m;
        };
        let inside: Vec<f64> = m
            .values()
            .iter()
            .zip(mask.values().iter())
            .filter(|(_, k)| **k != 0.0)
            .map(|(v, _)| *v)
            .collect();
        let p = effective_dtype(m.dtype, &inside);
        m.with_precision(p)
    }

    /// [`token_rows`] of `input_ids`, decoded on the first call; a file with an
    /// `attention_mask` of the same shape (weaver `batch_inputs/`) has its padding
    /// stripped by the mask instead of by pad id 0.
    pub fn input_ids(&self) -> Option<Rc<TokenRows>> {
        self.tokens
            .get_or_init(|| {
                let rows = token_rows(self.record, Field::InputIds)?;
                Some(Rc::new(match masked_spans(self.record, &rows) {
                    Some(spans) => rows.with_spans(spans),
                    None => rows,
                }))
            })
            .clone()
    }

    /// `input_ids` with runs of `pad` stripped from both ends of each row instead of 0
    /// (computed on each call; pad 0 is [`Tensors::input_ids`]).
    pub fn input_ids_pad(&self, pad: i64) -> Option<Rc<TokenRows>> {
        if pad == 0 {
            return self.input_ids();
        }
        let t = self.record.tensor(Field::InputIds)?;
        if t.ndim() != 2 {
            return None;
        }
        let w = t.shape()[1].max(1);
        let ids = t.to_i64_vec();
        let spans = ids
            .chunks(w)
            .enumerate()
            .map(|(i, r)| {
                let kept = strip_pad_range(r, pad);
                i * w + kept.start..i * w + kept.end
            })
            .collect();
        Some(Rc::new(TokenRows {
            ids: TokenIds::Owned(ids),
            spans,
            full: OnceCell::new(),
        }))
    }

    /// `input_ids` as row-major ids and their width, when 2-d and at least 2 wide (the
    /// shape both pad searches need).
    fn id_rows(&self) -> Option<(Vec<i64>, usize)> {
        let t = self.record.tensor(Field::InputIds)?;
        if t.ndim() != 2 || t.shape()[1] < 2 {
            return None;
        }
        Some((t.to_i64_vec(), t.shape()[1]))
    }

    /// The distinct non-zero tokens at the first and last position of each row of
    /// `input_ids` (pad candidates of a micro too small to show its pad in runs).
    fn edge_tokens(&self) -> Vec<i64> {
        let Some((ids, w)) = self.id_rows() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for r in ids.chunks(w) {
            for x in [r[0], r[w - 1]] {
                if x != 0 && !out.contains(&x) {
                    out.push(x);
                }
            }
        }
        out
    }

    /// The pad id this file's `input_ids` show, when not 0: the value repeated at the ends
    /// of the most rows (a run of at least two at the start or the end of a row; Qwen
    /// pads with 151643, Llama 3 with 128001), or the ids after a row's last valid
    /// response position (`response_mask` `[B, T]` over the last `T` columns, as verl's
    /// and NexRL's forward_data hold them: a single trailing pad tells too); `None` when
    /// no row shows one.
    pub fn pad_candidate(&self) -> Option<i64> {
        self.pad_candidates().into_iter().next()
    }

    /// Every token [`Tensors::pad_candidate`] weighs, the most telling first: after a
    /// multi-turn row's last valid position a tool turn's tokens sit beside a lone pad,
    /// each once, and only the pairing can tell them apart (7947, 8159).
    fn pad_candidates(&self) -> Vec<i64> {
        let Some((ids, w)) = self.id_rows() else {
            return Vec::new();
        };
        let mut counts: HashMap<i64, usize> = HashMap::new();
        for r in ids.chunks(w) {
            for (x, y) in [(r[0], r[1]), (r[w - 1], r[w - 2])] {
                if x == y && x != 0 {
                    *counts.entry(x).or_default() += 1;
                }
            }
        }
        let mask = self.mat(Field::ResponseMask);
        if let Some(m) =
            mask.filter(|m| counts.is_empty() && m.rows * w == ids.len() && m.width <= w)
        {
            for (r, row) in ids.chunks(w).enumerate() {
                let end = m.nonzero(r).last().map_or(0, |s| s.end);
                for x in &row[w - m.width + end..] {
                    if *x != 0 {
                        *counts.entry(*x).or_default() += 1;
                    }
                }
            }
        }
        let mut out: Vec<(i64, usize)> = counts.into_iter().collect();
        out.sort_by_key(|(v, n)| (std::cmp::Reverse(*n), *v));
        out.into_iter().map(|(v, _)| v).collect()
    }

    /// [`match_rows`] of this file's `input_ids` against `other`'s, computed once per pair
    /// of files; None when either lacks them. Padding is stripped as 0 first; when that
    /// leaves rows unpaired, either side's [`Tensors::pad_candidate`] is tried on both and
    /// the pads pairing the most rows are kept (any pad id, read from the data).
    pub(super) fn content_rows(&self, other: &Tensors<'_>) -> Option<Rc<RowMatch>> {
        let key: *const Record = other.record;
        if let Some((_, m)) = self.pairings.borrow().iter().find(|(k, _)| *k == key) {
            return Some(m.clone());
        }
        let (Some(a), Some(b)) = (self.input_ids(), other.input_ids()) else {
            // no token ids on one side: the rows' own log-probs say which is which
            let m = Rc::new(self.value_rows(other)?);
            self.pairings.borrow_mut().push((key, m.clone()));
            return Some(m);
        };
        let mut best = match_rows_by(a.len(), b.len(), |i, m| a.hash(i, m), |j, m| b.hash(j, m));
        if !best.only_a.is_empty() || !best.only_b.is_empty() {
            // both sides share a tokenizer: a pad one side shows in runs (a weaver row in
            // the datum layout keeps a single trailing pad) is the other's pad too
            let mut pads = vec![0];
            let (ca, cb) = (self.pad_candidates(), other.pad_candidates());
            pads.extend(ca.first().copied());
            pads.extend(cb.first().copied().filter(|p| !pads.contains(p)));
            // a micro too small to show its pad in runs (one row, one left pad): the
            // token at a row's edge on either side, and the lesser candidates of a
            // lone trailing pad, kept only where it pairs more rows
            let more = ca.into_iter().skip(1).chain(cb.into_iter().skip(1));
            for p in more.chain(self.edge_tokens()).chain(other.edge_tokens()) {
                if !pads.contains(&p) && pads.len() < 8 {
                    pads.push(p);
                }
            }
            for &pa in &pads {
                for &pb in &pads {
                    if (pa, pb) == (0, 0) {
                        continue;
                    }
                    let (Some(a), Some(b)) = (self.input_ids_pad(pa), other.input_ids_pad(pb))
                    else {
                        continue;
                    };
                    let m =
                        match_rows_by(a.len(), b.len(), |i, m| a.hash(i, m), |j, m| b.hash(j, m));
                    if m.pairs.len() > best.pairs.len() {
                        best = m;
                    }
                }
            }
        }
        let m = Rc::new(best);
        self.pairings.borrow_mut().push((key, m.clone()));
        Some(m)
    }
}

impl Tensors<'_> {
    /// `m` as this file's pairing with `other` for every comparison of the cell
    /// ([`super::pair_through_batch`]).
    pub(super) fn seed_pairing(&self, other: &Tensors<'_>, m: RowMatch) {
        let key: *const Record = other.record;
        self.pairings.borrow_mut().push((key, Rc::new(m)));
    }

    /// Rows paired by their values when one side holds no token ids (NexRL's self-hosted
    /// `forward_data` need not): each row's log-probs at its valid positions, in order
    /// (so a response-aligned side and a prompt-offset one compare alike), placed at the
    /// other side's row of the same valid count closest to them
    /// ([`crate::judge::locate`]: at most half as far as the next, or equal values).
    /// `None` unless both sides hold log-probs and a mask and every row is placed.
    fn value_rows(&self, other: &Tensors<'_>) -> Option<RowMatch> {
        use crate::judge::locate::{locate, PROBE};
        let mask_of = |t: &Tensors<'_>| {
            t.mat(Field::ResponseMask)
                .or_else(|| t.mat(Field::EffectiveMask))
        };
        let (la, lb) = (self.mat(Field::LogProbs)?, other.mat(Field::LogProbs)?);
        let (ma, mb) = (mask_of(self)?, mask_of(other)?);
        // each row's first PROBE valid values, packed from column 0 (so a
        // response-aligned side and a prompt-offset one compare alike)
        let packed = |l: &Mat, m: &Mat, r: usize| -> Vec<f64> {
            let row = l.row(r);
            m.nonzero(r)
                .iter()
                .flat_map(|span| span.clone())
                .take(PROBE)
                .filter_map(|c| row.get(c).copied())
                .collect()
        };
        let count = |m: &Mat, r: usize| m.nonzero(r).iter().map(|s| s.len()).sum::<usize>();
        let (na, nb) = (la.rows.min(ma.rows), lb.rows.min(mb.rows));
        let rows: Vec<Vec<(usize, f64)>> = (0..na)
            .map(|r| packed(&la, &ma, r).into_iter().enumerate().collect())
            .collect();
        let (ca, cb): (Vec<usize>, Vec<usize>) = (
            (0..na).map(|r| count(&ma, r)).collect(),
            (0..nb).map(|j| count(&mb, j)).collect(),
        );
        let placed = locate(
            &rows,
            nb,
            |j| std::borrow::Cow::Owned(packed(&lb, &mb, j)),
            |r, j| ca[r] == cb[j],
        );
        let mut pairs = Vec::with_capacity(na);
        for (r, p) in placed.iter().enumerate() {
            pairs.push((r, p.as_ref()?.old_row));
        }
        let only_b = (0..nb)
            .filter(|j| !pairs.iter().any(|(_, b)| b == j))
            .collect();
        Some(RowMatch {
            pairs,
            only_a: Vec::new(),
            only_b,
            method: crate::compare::align::MatchMethod::LogProbs,
        })
    }
}

/// Token rows with padding stripped: the ids (read in place when stored as
/// little-endian i64, else widened once) and each row's span of them.
#[derive(Debug, Clone)]
pub struct TokenRows {
    pub(super) ids: TokenIds,
    spans: Vec<std::ops::Range<usize>>,
    /// Each row's whole-row hash, once asked for (row pairing and batch lookup both ask).
    full: OnceCell<Vec<Option<u64>>>,
}

#[derive(Debug, Clone)]
pub(super) enum TokenIds {
    /// Widened to i64.
    Owned(Vec<i64>),
    /// A contiguous i64 tensor: its elements are the little-endian bytes
    /// [`tokens_hash`] hashes.
    Stored(Tensor),
}

impl TokenRows {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// [`tokens_hash`] of row `i`, or of row `i` without its last token (None when the
    /// row is empty). Whole-row hashes are computed once, for every row.
    pub fn hash(&self, i: usize, minus_last: bool) -> Option<u64> {
        if minus_last {
            return self.hash_of(i, true);
        }
        let full = self
            .full
            .get_or_init(|| (0..self.len()).map(|r| self.hash_of(r, false)).collect());
        full.get(i).copied().flatten()
    }

    /// [`TokenRows::hash`], computed.
    fn hash_of(&self, i: usize, minus_last: bool) -> Option<u64> {
        let s = self.spans.get(i)?;
        let end = if minus_last {
            s.end.checked_sub(1).filter(|&e| e >= s.start)?
        } else {
            s.end
        };
        Some(match &self.ids {
            TokenIds::Owned(ids) => tokens_hash(&ids[s.start..end]),
            TokenIds::Stored(t) => {
                let base = t.offset() * 8;
                xxhash_rust::xxh3::xxh3_64(&t.storage_bytes()[base + s.start * 8..base + end * 8])
            }
        })
    }
}

impl TokenRows {
    /// The same ids with other row spans.
    fn with_spans(self, spans: Vec<std::ops::Range<usize>>) -> TokenRows {
        TokenRows {
            spans,
            full: OnceCell::new(),
            ..self
        }
    }
}

/// Each row's span from its first to its last position where `attention_mask` is
/// non-zero (the real tokens, whatever the pad id), when the file holds a mask of the
/// ids' shape; `None` otherwise.
fn masked_spans(r: &Record, ids: &TokenRows) -> Option<Vec<std::ops::Range<usize>>> {
    let ids_t = r.tensor(Field::InputIds)?;
    let mask = r.tensor(Field::AttentionMask)?;
    if mask.shape() != ids_t.shape() || ids_t.ndim() != 2 || ids.spans.len() != ids_t.shape()[0] {
        return None;
    }
    let w = ids_t.shape()[1];
    let m = mask.to_f64_vec();
    Some(
        (0..ids.spans.len())
            .map(|r| {
                let row = &m[r * w..(r + 1) * w];
                let start = row.iter().position(|&x| x != 0.0).unwrap_or(w);
                let end = row.iter().rposition(|&x| x != 0.0).map_or(start, |i| i + 1);
                r * w + start..r * w + end
            })
            .collect(),
    )
}

/// The token rows of `field` (e.g. `input_ids`) with padding (0) stripped.
pub fn token_rows(r: &Record, field: Field) -> Option<TokenRows> {
    let t = r.tensor(field)?;
    if t.ndim() != 2 {
        return None;
    }
    let w = t.shape()[1].max(1);
    let n = t.numel();
    if t.dtype() == DType::I64 && t.is_contiguous() && n <= t.storage_numel() {
        let bytes = &t.storage_bytes()[t.offset() * 8..(t.offset() + n) * 8];
        // `strip_pad_range` of each row, on the stored ids as words: past the leading
        // and trailing zeros.
        let spans = bytes
            .chunks(w * 8)
            .enumerate()
            .map(|(r, row)| {
                // (`chunks_exact(8)`: every chunk converts.)
                let nonzero =
                    |c: &[u8]| <[u8; 8]>::try_from(c).is_ok_and(|a| u64::from_le_bytes(a) != 0);
                let ids = row.chunks_exact(8);
                let k = ids.len();
                let start = ids.clone().position(nonzero).unwrap_or(k);
                let end = ids
                    .skip(start)
                    .rposition(nonzero)
                    .map_or(start, |i| start + i + 1);
                r * w + start..r * w + end
            })
            .collect();
        return Some(TokenRows {
            ids: TokenIds::Stored(t),
            spans,
            full: OnceCell::new(),
        });
    }
    let ids = t.to_i64_vec();
    let spans = ids
        .chunks(w)
        .enumerate()
        .map(|(i, r)| {
            let kept = strip_pad_range(r, 0);
            i * w + kept.start..i * w + kept.end
        })
        .collect();
    Some(TokenRows {
        ids: TokenIds::Owned(ids),
        spans,
        full: OnceCell::new(),
    })
}

/// Pair the rows of a reference file with another file's by their `input_ids` (by index
/// when either lacks them, or there is no other file).
pub fn pair_rows(a: &Tensors<'_>, b: Option<&Tensors<'_>>, na: usize, nb: usize) -> Rc<RowMatch> {
    b.and_then(|b| a.content_rows(b))
        .unwrap_or_else(|| Rc::new(RowMatch::by_index(na, nb)))
}

/// The row summary the report shows.
pub fn row_summary(rm: &RowMatch) -> RowSummary {
    RowSummary {
        method: rm.method,
        pairs: rm.pairs.clone(),
        only_reference: rm.only_a.clone(),
        only_other: rm.only_b.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::align::strip_pad_range;
    use crate::value::Value;

    /// Stored i64 ids: each row's span is `strip_pad_range` of the row (zeros inside a
    /// row kept, leading and trailing ones dropped, an all-zero row empty), ids of every
    /// byte pattern counting as non-zero.
    #[test]
    fn stored_rows_strip_leading_and_trailing_zeros_only() {
        let rows: [[i64; 7]; 5] = [
            [0, 5, 0, 6, 0, 0, 0],
            [0; 7],
            [1 << 56, 0, 0, 0, 0, 0, 1],
            [0, 0, 0, 0, 0, 0, -1],
            [0, 0, 0, 256, 0, 0, 0],
        ];
        let flat: Vec<i64> = rows.iter().flatten().copied().collect();
        let t = Tensor::from_i64(vec![5, 7], &flat).unwrap();
        let v = Value::Dict(vec![(Value::Str("ids".into()), Value::Tensor(t))]);
        let names = |f: Field| (f == Field::InputIds).then_some("ids");
        let got = token_rows(&Record::new(v, names), Field::InputIds).unwrap();
        assert!(matches!(got.ids, TokenIds::Stored(_)));
        for (i, row) in rows.iter().enumerate() {
            let r = strip_pad_range(row, 0);
            assert_eq!(got.spans[i], i * 7 + r.start..i * 7 + r.end, "row {i}");
        }
    }
}
