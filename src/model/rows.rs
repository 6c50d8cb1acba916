//! A batch's rows seen the same way whatever the producer's column convention: each row's
//! response window (which columns hold its response tokens), its response token ids and
//! the values of a per-token tensor over that window. Tools that compare two producers
//! (dumpdiff's model comparison, the mismatch tool) read rows through these, so response
//! columns (verl, slime) and whole-sequence columns (NeMo-RL) line up.

use crate::model::step::{TokenBatch, TokenPositions, TokenTensor};

impl TokenBatch {
    /// Number of rows: the first dimension of any per-token tensor, else the row records.
    pub fn row_count(&self) -> usize {
        self.tensors()
            .find_map(|t| t.tensor.shape().first().copied())
            .unwrap_or(self.rows.len())
    }

    /// Every per-token tensor the batch holds.
    fn tensors(&self) -> impl Iterator<Item = &TokenTensor> {
        self.log_probs.values().chain(
            [
                &self.response_ids,
                &self.input_ids,
                &self.response_mask,
                &self.loss_mask,
                &self.advantages,
                &self.entropy,
                &self.attention_mask,
            ]
            .into_iter()
            .flatten(),
        )
    }

    /// Row `i`'s response window `(first column, number of tokens)` in the per-token
    /// tensors: for response columns it starts at 0 and spans the mask's last 1 (else the
    /// row's `response_len`); for sequence columns it spans the mask's first to last 1
    /// (else `prompt_len .. prompt_len + response_len`). `None` when nothing says.
    pub fn response_window(&self, i: usize) -> Option<(usize, usize)> {
        let mask = self.response_mask.as_ref().or(self.loss_mask.as_ref());
        let ones = mask.and_then(|m| row_of(&m.tensor, i)).map(|r| {
            let first = r.iter().position(|&x| x != 0.0);
            let last = r.iter().rposition(|&x| x != 0.0);
            (first, last)
        });
        let meta = self.rows.get(i);
        match self.positions {
            TokenPositions::Response => match ones {
                Some((_, Some(last))) => Some((0, last + 1)),
                Some((_, None)) => Some((0, 0)),
                None => meta?.response_len.map(|n| (0, n)),
            },
            TokenPositions::Sequence => match ones {
                Some((Some(first), Some(last))) => Some((first, last + 1 - first)),
                Some(_) => Some((0, 0)),
                None => {
                    let m = meta?;
                    Some((m.prompt_len?, m.response_len?))
                }
            },
        }
    }

    /// Row `i`'s response token ids: `response_ids` over the window, else `input_ids`
    /// over it (sequence columns) or after the row's prompt (response columns).
    pub fn response_tokens(&self, i: usize) -> Option<Vec<i64>> {
        let (start, n) = self.response_window(i)?;
        let slice = |t: &TokenTensor, from: usize| {
            let r = row_of(&t.tensor, i)?;
            r.get(from..from + n)
                .map(|s| s.iter().map(|&x| x as i64).collect())
        };
        match (self.positions, &self.response_ids, &self.input_ids) {
            (TokenPositions::Response, Some(ids), _) => slice(ids, start),
            (TokenPositions::Response, None, Some(ids)) => {
                slice(ids, self.rows.get(i)?.prompt_len?)
            }
            (TokenPositions::Sequence, _, Some(ids)) => slice(ids, start),
            _ => None,
        }
    }

    /// The values of `t` over row `i`'s response window.
    pub fn response_values(&self, t: &TokenTensor, i: usize) -> Option<Vec<f64>> {
        let (start, n) = self.response_window(i)?;
        row_of(&t.tensor, i)?
            .get(start..start + n)
            .map(<[f64]>::to_vec)
    }
}

/// Row `i` of a `[rows, T]` tensor as f64.
fn row_of(t: &crate::tensor::Tensor, i: usize) -> Option<Vec<f64>> {
    let [rows, w] = t.shape() else { return None };
    if i >= *rows {
        return None;
    }
    match t.rows(i, 1) {
        Some(r) => Some(r.to_f64_vec()),
        // A strided view: decode it whole and cut the row.
        None => t.to_f64_vec().get(i * w..(i + 1) * w).map(<[f64]>::to_vec),
    }
}
