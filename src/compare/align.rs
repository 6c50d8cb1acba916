//! Alignment: pair rows by content (token ids with padding stripped, tolerating the
//! datum layout's one-token shift) and walk the positions valid on both sides.

use std::collections::HashMap;

use serde::Serialize;

use crate::model::tokens::tokens_hash;

/// How two sides' rows were paired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchMethod {
    /// Same token sequences (padding stripped).
    Content,
    /// One side holds `tokens[:-1]` (datum layout) of the other's `tokens`.
    ContentShifted,
    /// No tokens on one side: row i pairs with row i.
    Index,
    /// No tokens on one side: rows paired by their log-probs at their valid positions.
    LogProbs,
    /// No tokens on one side, log-probs that pair no rows: each side's rows placed in the
    /// batch (by their log-probs against their own old log-probs, by their token ids
    /// through the trajectories) and paired where both name one trajectory.
    Batch,
}

/// The pairing of reference rows (`a`) with the other side's rows (`b`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RowMatch {
    /// `(a_row, b_row)` pairs, ascending by `a_row`.
    pub pairs: Vec<(usize, usize)>,
    /// Reference rows with no partner.
    pub only_a: Vec<usize>,
    /// Other-side rows with no partner.
    pub only_b: Vec<usize>,
    /// How rows were paired.
    pub method: MatchMethod,
}

impl RowMatch {
    /// Row `i` with row `i` for the first `min(na, nb)` rows.
    pub fn by_index(na: usize, nb: usize) -> Self {
        let n = na.min(nb);
        RowMatch {
            pairs: (0..n).map(|i| (i, i)).collect(),
            only_a: (n..na).collect(),
            only_b: (n..nb).collect(),
            method: MatchMethod::Index,
        }
    }

    /// True when some pair is not `(i, i)`.
    pub fn reordered(&self) -> bool {
        self.pairs.iter().any(|(a, b)| a != b)
    }
}

/// The tokens of a padded row without the leading and trailing `pad` ids.
pub fn strip_pad(tokens: &[i64], pad: i64) -> &[i64] {
    &tokens[strip_pad_range(tokens, pad)]
}

/// Where [`strip_pad`]'s tokens sit in the row.
pub fn strip_pad_range(tokens: &[i64], pad: i64) -> std::ops::Range<usize> {
    let start = tokens
        .iter()
        .position(|&t| t != pad)
        .unwrap_or(tokens.len());
    let end = tokens
        .iter()
        .rposition(|&t| t != pad)
        .map_or(start, |e| e + 1);
    start..end
}

/// Pair rows by content. Rows are token sequences already stripped of padding. Exact
/// matches are preferred; otherwise a row equal to the other's sequence minus its last
/// token (the datum layout) is accepted. Duplicate sequences pair in order.
pub fn match_rows(a: &[&[i64]], b: &[&[i64]]) -> RowMatch {
    let hash = |rows: &[&[i64]], i: usize, minus_last: bool| {
        let row = rows[i];
        match (minus_last, row.split_last()) {
            (false, _) => Some(tokens_hash(row)),
            (true, Some((_, head))) => Some(tokens_hash(head)),
            (true, None) => None,
        }
    };
    match_rows_by(a.len(), b.len(), |i, m| hash(a, i, m), |j, m| hash(b, j, m))
}

/// [`match_rows`] of `na` and `nb` rows known by their [`tokens_hash`]: `hash_a(i, false)`
/// of row `i`, `hash_a(i, true)` of row `i` without its last token (None for an empty
/// row). Each row's full hash is asked for once.
pub fn match_rows_by(
    na: usize,
    nb: usize,
    hash_a: impl Fn(usize, bool) -> Option<u64>,
    hash_b: impl Fn(usize, bool) -> Option<u64>,
) -> RowMatch {
    let full_b: Vec<Option<u64>> = (0..nb).map(|j| hash_b(j, false)).collect();
    let mut exact: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut shifted: HashMap<u64, Vec<usize>> = HashMap::new();
    for j in (0..nb).rev() {
        if let Some(h) = full_b[j] {
            exact.entry(h).or_default().push(j);
        }
    }
    let mut used = vec![false; nb];
    let mut pairs = Vec::new();
    let mut only_a = Vec::new();
    let mut any_shift = false;
    let mut pending = Vec::new();
    for i in 0..na {
        match hash_a(i, false).and_then(|h| take(&mut exact, h, &mut used)) {
            Some(j) => pairs.push((i, j)),
            None => pending.push(i),
        }
    }
    // Second pass for the datum layout: b = a[:-1] or a = b[:-1].
    if !pending.is_empty() {
        for j in (0..nb).rev() {
            if let (false, Some(h)) = (used[j], full_b[j]) {
                shifted.entry(h).or_default().push(j);
            }
        }
    }
    // b's rows without their last token, hashed when first needed (the datum layout
    // b = a[:-1] pairs every row through `shifted`): the rows free by then are the ones
    // free before the loop less those it paired, which `take` skips anyway.
    let mut b_minus_last: Option<HashMap<u64, Vec<usize>>> = None;
    for i in pending {
        let j = hash_a(i, true)
            .and_then(|h| take(&mut shifted, h, &mut used))
            .or_else(|| {
                let h = hash_a(i, false)?;
                let map = b_minus_last.get_or_insert_with(|| {
                    let mut m: HashMap<u64, Vec<usize>> = HashMap::new();
                    for j in (0..nb).rev() {
                        if let (false, Some(h)) = (used[j], hash_b(j, true)) {
                            m.entry(h).or_default().push(j);
                        }
                    }
                    m
                });
                take(map, h, &mut used)
            });
        match j {
            Some(j) => {
                any_shift = true;
                pairs.push((i, j));
            }
            None => only_a.push(i),
        }
    }
    pairs.sort_unstable();
    let only_b = (0..nb).filter(|&j| !used[j]).collect();
    RowMatch {
        pairs,
        only_a,
        only_b,
        method: if any_shift {
            MatchMethod::ContentShifted
        } else {
            MatchMethod::Content
        },
    }
}

/// Pop the first unused row under `key`.
fn take(map: &mut HashMap<u64, Vec<usize>>, key: u64, used: &mut [bool]) -> Option<usize> {
    let list = map.get_mut(&key)?;
    while let Some(j) = list.pop() {
        if !used[j] {
            used[j] = true;
            return Some(j);
        }
    }
    None
}

/// Positions of one row pair, classified by the two validity masks (a position past a
/// side's trimmed width is invalid there).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PositionSplit {
    /// Valid on both sides: compared.
    pub both: Vec<usize>,
    /// Valid on the reference side only.
    pub only_a: Vec<usize>,
    /// Valid on the other side only.
    pub only_b: Vec<usize>,
}

/// Split positions `0..max(len)` by validity on each side (`mask != 0`).
pub fn split_positions(mask_a: &[i64], mask_b: &[i64]) -> PositionSplit {
    let mut s = PositionSplit::default();
    for p in 0..mask_a.len().max(mask_b.len()) {
        let va = mask_a.get(p).is_some_and(|&m| m != 0);
        let vb = mask_b.get(p).is_some_and(|&m| m != 0);
        match (va, vb) {
            (true, true) => s.both.push(p),
            (true, false) => s.only_a.push(p),
            (false, true) => s.only_b.push(p),
            (false, false) => {}
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_pad_both_ends() {
        assert_eq!(strip_pad(&[0, 0, 5, 6, 0, 7, 0], 0), &[5, 6, 0, 7]);
        assert_eq!(strip_pad(&[0, 0], 0), &[] as &[i64]);
    }

    #[test]
    fn swapped_rows_pair_by_content() {
        let a: [&[i64]; 2] = [&[1, 2, 3], &[4, 5]];
        let b: [&[i64]; 2] = [&[4, 5], &[1, 2, 3]];
        let m = match_rows(&a, &b);
        assert_eq!(m.pairs, vec![(0, 1), (1, 0)]);
        assert!(m.reordered());
        assert_eq!(m.method, MatchMethod::Content);
    }

    #[test]
    fn datum_layout_pairs_with_shift_and_leftovers_reported() {
        let a: [&[i64]; 3] = [&[1, 2, 3], &[4, 5, 6], &[9, 9]];
        let b: [&[i64]; 2] = [&[4, 5], &[1, 2]];
        let m = match_rows(&a, &b);
        assert_eq!(m.pairs, vec![(0, 1), (1, 0)]);
        assert_eq!(m.only_a, vec![2]);
        assert!(m.only_b.is_empty());
        assert_eq!(m.method, MatchMethod::ContentShifted);
    }

    #[test]
    fn duplicates_pair_in_order() {
        let a: [&[i64]; 2] = [&[1], &[1]];
        let b: [&[i64]; 2] = [&[1], &[1]];
        assert_eq!(match_rows(&a, &b).pairs, vec![(0, 0), (1, 1)]);
    }

    #[test]
    fn positions_split_by_masks_and_widths() {
        let s = split_positions(&[1, 1, 1, 0], &[1, 0]);
        assert_eq!(s.both, vec![0]);
        assert_eq!(s.only_a, vec![1, 2]);
        assert!(s.only_b.is_empty());
    }
}
