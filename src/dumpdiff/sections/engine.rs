//! The comparison engine: one tensor pair, chunk by chunk, judged by its tolerance.

use super::*;

/// Shared inputs of one cell's comparisons.
pub struct PairCtx<'a> {
    /// Tolerance policy.
    pub policy: &'a TolerancePolicy,
    /// Section prefix of names (`forward_data`).
    pub section: &'a str,
    /// Row pairing.
    pub rows: &'a RowMatch,
    /// Validity mask, reference side (None: every position of the data is valid).
    pub mask_a: Option<&'a Mat>,
    /// Validity mask, other side.
    pub mask_b: Option<&'a Mat>,
    /// The precision of the cell's log-prob inputs, which bounds derived quantities.
    pub cell_precision: Option<DType>,
}

/// Reusable buffers of one comparison: decoded chunks of each input, and the pairs kept.
#[derive(Default)]
pub(super) struct Bufs {
    a: Vec<f64>,
    b: Vec<f64>,
    extra: Vec<f64>,
    extra_padded: Vec<f64>,
    ranges: Vec<Range<usize>>,
    kept: Kept,
}

/// The pairs of a chunk valid on both sides, with their positions.
#[derive(Default)]
pub(super) struct Kept {
    a: Vec<f64>,
    b: Vec<f64>,
    extra: Vec<f64>,
    pos: Vec<usize>,
}

impl Kept {
    /// Gather the pairs at `ranges` (absolute positions, within a chunk read from `lo`);
    /// without `xb` (the other side equal to `xa`), only `xa`'s values.
    pub(super) fn gather(
        &mut self,
        ranges: &[Range<usize>],
        lo: usize,
        xa: &[f64],
        xb: Option<&[f64]>,
        ex: Option<&[f64]>,
    ) {
        self.a.clear();
        self.b.clear();
        self.extra.clear();
        self.pos.clear();
        for r in ranges {
            let local = r.start - lo..r.end - lo;
            self.a.extend_from_slice(&xa[local.clone()]);
            if let Some(xb) = xb {
                self.b.extend_from_slice(&xb[local.clone()]);
            }
            if let Some(e) = ex {
                self.extra.extend_from_slice(&e[local]);
            }
            self.pos.extend(r.clone());
        }
    }
}

/// The positions of `[0, n)` in both `a` and `b` (ascending ranges each), as ascending
/// ranges of at most [`CHUNK`] positions, into `out`.
pub(super) fn intersect(
    a: &[Range<usize>],
    b: &[Range<usize>],
    n: usize,
    out: &mut Vec<Range<usize>>,
) {
    out.clear();
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let start = a[i].start.max(b[j].start);
        let end = a[i].end.min(b[j].end).min(n);
        let mut s = start;
        while s < end {
            let e = (s + CHUNK).min(end);
            out.push(s..e);
            s = e;
        }
        if a[i].end < b[j].end {
            i += 1;
        } else {
            j += 1;
        }
    }
}

/// When the ones of two 0/1 rows (their [`Mat::nonzero`] runs, ascending) lie in the
/// same positions of `[p0, p1)`: how many there are, and the value at `p0`.
fn same_ones(a: &[Range<usize>], b: &[Range<usize>], p0: usize, p1: usize) -> Option<(u64, f64)> {
    if !clipped(a, p0, p1).eq(clipped(b, p0, p1)) {
        return None;
    }
    let ones = clipped(a, p0, p1).map(|r| (r.end - r.start) as u64).sum();
    let first = if clipped(a, p0, p1).next().is_some_and(|r| r.start == p0) {
        1.0
    } else {
        0.0
    };
    Some((ones, first))
}

/// The non-empty parts of ascending `runs` within `[p0, p1)`.
fn clipped(runs: &[Range<usize>], p0: usize, p1: usize) -> impl Iterator<Item = Range<usize>> + '_ {
    runs.iter()
        .map(move |r| r.start.max(p0)..r.end.min(p1))
        .filter(|r| r.start < r.end)
}

/// `v` padded with zeros to `len` (copied into `buf` only when short).
pub(super) fn padded<'s>(v: &'s [f64], len: usize, buf: &'s mut Vec<f64>) -> &'s [f64] {
    if v.len() >= len {
        return v;
    }
    buf.clear();
    buf.extend_from_slice(v);
    buf.resize(len, 0.0);
    buf
}

pub(super) fn ulp_dtype(a: DType, b: DType) -> Option<DType> {
    (a == b && a.is_float()).then_some(a)
}

impl PairCtx<'_> {
    pub(super) fn tolerance(
        &self,
        name: &str,
        precision: DType,
        derived: bool,
    ) -> (Tolerance, DType) {
        let p = match (derived, self.cell_precision) {
            (true, Some(c)) if precision.is_float() => coarser(precision, c),
            _ => precision,
        };
        (self.policy.resolve(name, p, derived), p)
    }

    /// Compare two row-wise tensors at positions valid on both sides.
    #[allow(clippy::too_many_arguments)]
    pub fn masked(
        &self,
        key: &str,
        a: &Mat,
        b: &Mat,
        origin_a: Origin,
        origin_b: Origin,
        derived: bool,
        logprob: bool,
    ) -> Comparison {
        self.masked_with(key, a, b, origin_a, origin_b, derived, logprob, None)
    }

    /// [`PairCtx::masked`] for a derived tensor whose elements carry the error propagated
    /// from their inputs (`extra`, same layout as `a`): judged at the values' own precision
    /// plus that error (see [`crate::compare::propagate`]).
    pub fn propagated(
        &self,
        key: &str,
        a: &Mat,
        b: &Mat,
        origin_a: Origin,
        origin_b: Origin,
        extra: &Mat,
    ) -> Comparison {
        self.masked_with(key, a, b, origin_a, origin_b, false, false, Some(extra))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn masked_with(
        &self,
        key: &str,
        a: &Mat,
        b: &Mat,
        origin_a: Origin,
        origin_b: Origin,
        derived: bool,
        logprob: bool,
        extra: Option<&Mat>,
    ) -> Comparison {
        let name = format!("{}.{key}", self.section);
        let (mut tol, precision) =
            self.tolerance(&name, coarser(a.precision(), b.precision()), derived);
        let extra = extra.filter(|_| !self.policy.overridden());
        if extra.is_some() {
            tol.source = format!("{} + error propagated from log-prob inputs", tol.source);
        }
        let metrics = self.measure(a, b, &tol, logprob, extra);
        comparison(name, metrics, tol, precision, a, b, origin_a, origin_b)
    }

    /// The metrics of `a` against `b` at the positions valid on both sides, each element
    /// allowed `tol` plus its `extra`.
    pub(super) fn measure(
        &self,
        a: &Mat,
        b: &Mat,
        tol: &Tolerance,
        logprob: bool,
        extra: Option<&Mat>,
    ) -> PairMetrics {
        let mut acc = Accumulator::new(tol.clone(), ulp_dtype(a.dtype, b.dtype), logprob);
        let mut buf = Bufs::default();
        for &(ra, rb) in &self.rows.pairs {
            // Positions of both rows (none when either row is missing) valid on both sides.
            let n = if ra < a.rows && rb < b.rows {
                a.width.min(b.width)
            } else {
                0
            };
            let all = 0..n;
            let full = std::slice::from_ref(&all);
            let va = self.mask_a.map_or(full, |m| m.nonzero(ra));
            let vb = self.mask_b.map_or(full, |m| m.nonzero(rb));
            let mut ranges = std::mem::take(&mut buf.ranges);
            intersect(va, vb, n, &mut ranges);
            // Batches of ranges spanning at most CHUNK positions (every range is at most
            // that long): read once, then fed straight (one range) or gathered (several).
            let mut rest = &ranges[..];
            while let Some(first) = rest.first() {
                let lo = first.start;
                let k = rest
                    .iter()
                    .take_while(|r| r.end <= lo + CHUNK)
                    .count()
                    .max(1);
                let (batch, tail) = rest.split_at(k);
                rest = tail;
                let hi = batch[k - 1].end;
                // Equal stored bytes decode to equal values: read one side only.
                let same = a.same_stored(ra, b, rb, lo, hi);
                let xa = a.chunk(ra, lo, hi, &mut buf.a);
                let xb = if same {
                    xa
                } else {
                    b.chunk(rb, lo, hi, &mut buf.b)
                };
                // An extra narrower than the data adds 0 past its end.
                let ex = extra.map(|e| {
                    let v = e.chunk(ra, lo, hi, &mut buf.extra);
                    padded(v, hi - lo, &mut buf.extra_padded)
                });
                if let [only] = batch {
                    let r = only.start - lo..only.end - lo;
                    let ex = ex.map(|e| &e[r.clone()]);
                    let pos = Positions::From(only.start);
                    if same {
                        acc.push_run_same(&xa[r], ex, pos, ra, rb);
                    } else {
                        acc.push_run(&xa[r.clone()], &xb[r], ex, pos, ra, rb);
                    }
                } else {
                    let c = &mut buf.kept;
                    c.gather(batch, lo, xa, (!same).then_some(xb), ex);
                    let ex = ex.map(|_| &c.extra[..]);
                    let pos = Positions::At(&c.pos);
                    if same {
                        acc.push_run_same(&c.a, ex, pos, ra, rb);
                    } else {
                        acc.push_run(&c.a, &c.b, ex, pos, ra, rb);
                    }
                }
            }
            buf.ranges = ranges;
        }
        acc.finish()
    }

    /// [`PairCtx::masked`] of the reference's log-probs against the other side's, reusing
    /// `memo` (a comparison of the same pairs made earlier in the cell) when the inputs
    /// are the same values at the same positions under the same tolerance: weaver dumps
    /// one log-prob tensor in both `forward_data` and `is_loss_debug`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn logprobs_memo(
        &self,
        a: &Mat,
        b: &Rc<Mat>,
        mask_b: Option<&Rc<Mat>>,
        rows: &Rc<RowMatch>,
        origin_a: Origin,
        origin_b: Origin,
        memo: &RefCell<Option<LogprobMemo>>,
    ) -> Comparison {
        let name = format!("{}.log_probs", self.section);
        let (tol, precision) = self.tolerance(&name, coarser(a.precision(), b.precision()), false);
        let key = (tol.atol.to_bits(), tol.rtol.to_bits());
        let reused = memo.borrow().as_ref().and_then(|m| {
            let same_mask = match (&m.mask_b, mask_b) {
                (None, None) => true,
                (Some(x), Some(y)) => x.same_nonzero(y),
                _ => false,
            };
            (m.tol == key && m.rows.pairs == rows.pairs && same_mask && m.b.same_values(b))
                .then(|| m.metrics.clone())
        });
        let metrics = reused.unwrap_or_else(|| self.measure(a, b, &tol, true, None));
        *memo.borrow_mut() = Some(LogprobMemo {
            b: b.clone(),
            mask_b: mask_b.cloned(),
            rows: rows.clone(),
            tol: key,
            metrics: metrics.clone(),
        });
        comparison(name, metrics, tol, precision, a, b, origin_a, origin_b)
    }

    /// Compare two masks (or other 0/1 tensors) exactly over every position, a position
    /// past a trimmed side's width counting as 0.
    pub fn exact_rows(
        &self,
        key: &str,
        a: &Mat,
        b: &Mat,
        origin_a: Origin,
        origin_b: Origin,
    ) -> Comparison {
        self.exact_rows_with(key, a, b, origin_a, origin_b, true)
    }

    /// [`PairCtx::exact_rows`]; with `by_runs`, a chunk of two 0/1 masks whose ones lie in
    /// the same places ([`Mat::nonzero`]) is added from its count of ones
    /// ([`Accumulator::push_zero_one_run`]) without decoding either side; without, every
    /// chunk is decoded (the tests pin the two equal).
    pub(super) fn exact_rows_with(
        &self,
        key: &str,
        a: &Mat,
        b: &Mat,
        origin_a: Origin,
        origin_b: Origin,
        by_runs: bool,
    ) -> Comparison {
        let name = format!("{}.{key}", self.section);
        let tol = self.policy.resolve(&name, DType::I64, false);
        let mut acc = Accumulator::new(tol.clone(), None, false);
        let mut buf = Bufs::default();
        let width = |m: &Mat, r: usize| if r < m.rows { m.width } else { 0 };
        let by_runs = by_runs && a.zero_one() && b.zero_one();
        for &(ra, rb) in &self.rows.pairs {
            let n = width(a, ra).max(width(b, rb));
            for p0 in (0..n).step_by(CHUNK) {
                let p1 = (p0 + CHUNK).min(n);
                let pos = Positions::From(p0);
                if by_runs {
                    if let Some((ones, first)) = same_ones(a.nonzero(ra), b.nonzero(rb), p0, p1) {
                        let loc = ElemLoc {
                            row: ra,
                            other_row: rb,
                            pos: p0,
                        };
                        if acc.push_zero_one_run(p1 - p0, first, ones, loc) {
                            continue;
                        }
                    }
                }
                if a.same_stored(ra, b, rb, p0, p1) {
                    // Both sides hold every position, with equal bytes: one side read.
                    acc.push_run_same(a.chunk(ra, p0, p1, &mut buf.a), None, pos, ra, rb);
                    continue;
                }
                let xa = padded(a.chunk(ra, p0, p1, &mut buf.a), p1 - p0, &mut buf.kept.a);
                let xb = padded(b.chunk(rb, p0, p1, &mut buf.b), p1 - p0, &mut buf.kept.b);
                acc.push_run(xa, xb, None, pos, ra, rb);
            }
        }
        finish(name, acc, tol, DType::I64, a, b, origin_a, origin_b)
    }

    /// [`Self::scalar_centered`] around the predicted difference (`predicted`: its
    /// allowance and center); a pair that fails there but agrees within the same allowance
    /// around no difference at all passes: a side may dump its log-probs rounded
    /// (bf16/f16) after computing its loss from finer ones (the held-out step), so
    /// the rounding of its dump predicts nothing of its loss.
    pub fn scalar_predicted(
        &self,
        key: &str,
        (a, b): (Option<Number>, Option<Number>),
        origins: (Origin, Origin),
        derived: bool,
        (predicted, center): (Option<(f64, String)>, f64),
    ) -> Option<Comparison> {
        let c = self.scalar_centered(
            key,
            a,
            b,
            origins.clone(),
            derived,
            predicted.clone(),
            center,
        )?;
        if c.verdict != Verdict::Fail || center == 0.0 {
            return Some(c);
        }
        match self.scalar_centered(key, a, b, origins, derived, predicted, 0.0) {
            Some(mut p) if p.verdict == Verdict::Pass => {
                p.reason = format!(
                    "{} — with no difference at all, not the one its dumped log-probs' \
                     rounding predicts ({}): the side computed its loss from finer \
                     log-probs than it dumped",
                    p.reason,
                    crate::fmt::num(center)
                );
                Some(p)
            }
            _ => Some(c),
        }
    }

    /// Compare two dumped scalars (`None` when not numbers: no comparison), judging
    /// `a − b − center` instead of `a − b`: `center` is the difference the inputs' known
    /// differences predict (the reported `a` stays the dumped value; `abs_diff` is what
    /// the prediction leaves unexplained). `propagated` (the error a masked aggregate
    /// inherits from its elements, with how it was obtained) replaces the
    /// derived-precision rule when known.
    #[allow(clippy::too_many_arguments)]
    pub fn scalar_centered(
        &self,
        key: &str,
        a: Option<Number>,
        b: Option<Number>,
        (origin_a, origin_b): (Origin, Origin),
        derived: bool,
        propagated: Option<(f64, String)>,
        center: f64,
    ) -> Option<Comparison> {
        let propagated = propagated.filter(|_| !self.policy.overridden());
        let center = if propagated.is_some() { center } else { 0.0 };
        let derived = derived && propagated.is_none();
        let (a, b) = (a?, b?);
        let (x, y) = (a.value, b.value);
        let (da, db) = (a.dtype, b.dtype);
        let prec = coarser(effective_dtype(da, &[x]), effective_dtype(db, &[y]));
        let prec = if da.is_float() || db.is_float() {
            prec
        } else {
            DType::I64
        };
        let name = format!("{}.{key}", self.section);
        let (mut tol, precision) = self.tolerance(&name, prec, derived);
        let extra = match &propagated {
            Some((e, how)) => {
                tol.source = format!("{} + {} {how}", tol.source, crate::fmt::num(*e));
                *e
            }
            None => 0.0,
        };
        let mut acc = Accumulator::new(tol.clone(), None, false);
        acc.push_allowing(x - center, y, extra, ElemLoc::default());
        let mut metrics = acc.finish();
        for d in [metrics.max_abs.as_mut(), metrics.first_beyond.as_mut()]
            .into_iter()
            .flatten()
        {
            d.a = x;
        }
        let (verdict, reason) = tol.verdict(metrics.beyond, metrics.count);
        Some(Comparison {
            name,
            origin_a,
            origin_b,
            dtype_a: Some(da),
            dtype_b: Some(db),
            precision: Some(precision),
            shape_a: vec![],
            shape_b: vec![],
            tolerance: tol,
            metrics: Some(metrics),
            verdict,
            reason,
        })
    }
}

/// Turn an accumulator into a [`Comparison`] judged by `tol`.
#[allow(clippy::too_many_arguments)]
pub fn finish(
    name: String,
    acc: Accumulator,
    tol: Tolerance,
    precision: DType,
    a: &Mat,
    b: &Mat,
    origin_a: Origin,
    origin_b: Origin,
) -> Comparison {
    comparison(name, acc.finish(), tol, precision, a, b, origin_a, origin_b)
}

/// A [`Comparison`] of `metrics` judged by `tol`.
#[allow(clippy::too_many_arguments)]
pub(super) fn comparison(
    name: String,
    metrics: PairMetrics,
    tol: Tolerance,
    precision: DType,
    a: &Mat,
    b: &Mat,
    origin_a: Origin,
    origin_b: Origin,
) -> Comparison {
    let (verdict, reason) = tol.verdict(metrics.beyond, metrics.count);
    Comparison {
        name,
        origin_a,
        origin_b,
        dtype_a: Some(a.dtype),
        dtype_b: Some(b.dtype),
        precision: Some(precision),
        shape_a: a.shape.clone(),
        shape_b: b.shape.clone(),
        tolerance: tol,
        metrics: Some(metrics),
        verdict,
        reason,
    }
}

/// A comparison that could not be made, with the reason (verdict Skipped).
pub fn skipped(section: &str, key: &str, reason: impl Into<String>) -> Comparison {
    Comparison {
        name: format!("{section}.{key}"),
        origin_a: Origin::dumped("-", key),
        origin_b: Origin::dumped("-", key),
        dtype_a: None,
        dtype_b: None,
        precision: None,
        shape_a: vec![],
        shape_b: vec![],
        tolerance: Tolerance::new(0.0, 0.0, "n/a"),
        metrics: None,
        verdict: Verdict::Skipped,
        reason: reason.into(),
    }
}
