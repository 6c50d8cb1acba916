//! Fused forward path of [`super::loss::compute`]: one pass per row (rayon over rows) over
//! plain slices computes the ratio, the per-token loss, the KL/entropy terms and every
//! row sum the aggregations and metrics need, instead of materialising one candle tensor
//! per intermediate. Each per-token value is computed with the same operations, in the
//! same dtype and order as the candle kernels (so it is bit-identical); only the
//! whole-batch sums differ in order (row partials, then rows in order), which moves f64
//! results by a few ulps. The candle kernels stay the reference and the autograd path.

use candle_core::{DType, Device, Storage, Tensor, WithDType};
use rayon::prelude::*;

use super::aggregate::AggMode;
use super::kl::KlEstimator;
use super::loss::RatioLevel;
use super::loss::{KlPlacement, LossConfig, LossInputs, LossOutput, Metrics, PolicyKind};
use super::KResult;

/// The float types the fused path runs in.
pub(crate) trait Float:
    WithDType
    + Copy
    + Send
    + Sync
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::ops::AddAssign
    + std::ops::DivAssign
    + std::ops::SubAssign
{
    fn exp_(self) -> Self;
    fn abs_(self) -> Self;
}

impl Float for f64 {
    fn exp_(self) -> Self {
        self.exp()
    }
    fn abs_(self) -> Self {
        self.abs()
    }
}

impl Float for f32 {
    fn exp_(self) -> Self {
        self.exp()
    }
    fn abs_(self) -> Self {
        self.abs()
    }
}

/// A contiguous CPU tensor's values in dtype `T` (converted and made contiguous first when
/// needed).
fn values<T: Float>(t: &Tensor) -> KResult<Vec<T>> {
    let t = t.to_dtype(T::DTYPE)?.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Ok(t.flatten_all()?.to_vec1::<T>()?);
    };
    let all: &[T] = T::cpu_storage_as_slice(cpu)?;
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(all[a..b].to_vec()),
        None => Ok(t.flatten_all()?.to_vec1::<T>()?),
    }
}

/// `clamp_torch` on one value (bounds already in `T`).
#[inline(always)]
fn clamp<T: Float>(x: T, lo: Option<T>, hi: Option<T>) -> T {
    let mut y = x;
    if let Some(lo) = lo {
        if y <= lo {
            y = lo;
        }
    }
    if let Some(hi) = hi {
        if y >= hi {
            y = hi;
        }
    }
    y
}

/// `x − x` as candle computes `x - x.detach()`: 0 for a finite `x`, NaN for ±inf/NaN.
#[inline(always)]
#[allow(clippy::eq_op)]
fn self_diff<T: Float>(x: T) -> T {
    x - x
}

#[inline(always)]
fn b2f<T: Float>(b: bool) -> T {
    if b {
        T::one()
    } else {
        T::zero()
    }
}

/// candle's `maximum` / `minimum`.
#[inline(always)]
fn maximum<T: Float>(a: T, b: T) -> T {
    if a < b {
        b
    } else {
        a
    }
}
#[inline(always)]
fn minimum<T: Float>(a: T, b: T) -> T {
    if a > b {
        b
    } else {
        a
    }
}

/// Per-token KL estimator, as [`super::kl::kl`].
#[inline(always)]
fn kl_value<T: Float>(lp: T, rf: T, est: KlEstimator) -> T {
    let d = lp - rf;
    let half = T::from_f64(0.5);
    let zero = T::zero();
    let m1 = T::from_f64(-1.0);
    let k3v = || {
        let k = clamp(rf - lp, Some(T::from_f64(-20.0)), Some(T::from_f64(20.0)));
        let kld = (k.exp_() - k) * T::one() + m1;
        clamp(kld, Some(T::from_f64(-10.0)), Some(T::from_f64(10.0)))
    };
    match est {
        KlEstimator::K1 => d,
        KlEstimator::Abs => d.abs_(),
        KlEstimator::K2 => d * d * half + zero,
        KlEstimator::K3 => {
            let r = rf - lp;
            (r.exp_() - r) * T::one() + m1
        }
        KlEstimator::K3Verl => k3v(),
        KlEstimator::K3VerlStraightThrough => {
            let back = d * d * half + zero;
            self_diff(back) + k3v()
        }
        KlEstimator::MlxRatio => {
            let e = d.exp_();
            (e * e - d) * T::one() + m1
        }
    }
}

/// Row sums: `trl` = Σ x·m, `verl` = Σ where(m≠0, x, 0)·m.
#[derive(Clone, Copy)]
struct Pair<T> {
    trl: T,
    verl: T,
}

impl<T: Float> Pair<T> {
    fn zero() -> Self {
        Pair {
            trl: T::zero(),
            verl: T::zero(),
        }
    }
    #[inline(always)]
    fn add(&mut self, x: T, m: T) {
        self.trl += x * m;
        self.verl += if m != T::zero() { x } else { T::zero() } * m;
    }
}

#[derive(Clone, Copy)]
struct Row<T> {
    cnt: T,
    pt: Pair<T>,
    k: Pair<T>,
    e: Pair<T>,
    low: T,
    high: T,
    region: T,
    first: [T; 3],
    frac: T,
    lower: T,
    ppo_kl: T,
    approx: T,
    avg: T,
    clip: T,
}

impl<T: Float> Row<T> {
    fn zero() -> Self {
        let z = T::zero();
        Row {
            cnt: z,
            pt: Pair::zero(),
            k: Pair::zero(),
            e: Pair::zero(),
            low: z,
            high: z,
            region: z,
            first: [z; 3],
            frac: z,
            lower: z,
            ppo_kl: z,
            approx: z,
            avg: z,
            clip: z,
        }
    }
}

/// [`super::aggregate::aggregate`] from per-row sums.
fn aggregate<T: Float>(
    rows: &[Row<T>],
    pick: impl Fn(&Row<T>) -> Pair<T>,
    mode: AggMode,
    t: usize,
) -> T {
    let b = rows.len();
    let sum = |f: &dyn Fn(&Row<T>) -> T| {
        let mut s = T::zero();
        for r in rows {
            s += f(r);
        }
        s
    };
    let one = T::one();
    match mode {
        AggMode::TokenMean => sum(&|r| pick(r).verl) / sum(&|r| r.cnt),
        AggMode::SeqMeanTokenMean
        | AggMode::SeqMeanTokenSum
        | AggMode::SeqMeanTokenSumNorm { .. } => {
            let mut num = T::zero();
            let mut den = T::zero();
            for r in rows {
                let mut seq = pick(r).verl;
                if mode == AggMode::SeqMeanTokenMean {
                    seq /= r.cnt * one + T::from_f64(1e-8);
                }
                let sm: T = b2f(r.cnt > T::zero());
                num += if sm != T::zero() { seq } else { T::zero() } * sm;
                den += sm;
            }
            let loss = num / den;
            match mode {
                AggMode::SeqMeanTokenSumNorm { horizon } => {
                    loss / T::from_f64(horizon.unwrap_or(t as f64))
                }
                _ => loss,
            }
        }
        AggMode::TrlGrpo => {
            let mut s = T::zero();
            for r in rows {
                s += pick(r).trl / clamp(r.cnt, Some(one), None);
            }
            s * T::from_f64(1.0 / b as f64) + T::zero()
        }
        AggMode::TrlBnpo => sum(&|r| pick(r).trl) / clamp(sum(&|r| r.cnt), Some(one), None),
        AggMode::TrlDrGrpo {
            max_completion_length,
        } => {
            let l = max_completion_length.unwrap_or(t as f64);
            sum(&|r| pick(r).trl) / T::from_f64(b as f64 * l)
        }
        AggMode::TrlDapo { num_items_in_batch } => {
            let n = match num_items_in_batch {
                Some(n) => n.max(1.0),
                None => sum(&|r| r.cnt).to_f64().max(1.0),
            };
            sum(&|r| pick(r).trl) / T::from_f64(n)
        }
    }
}

/// The fused forward pass, or `None` when it does not apply (non-CPU inputs or anything
/// the candle path must refuse with its own message: wrong shapes, a missing reference,
/// a bad `clip_ratio_c`); the caller then runs the candle path.
pub fn compute_fused(inp: &LossInputs, cfg: &LossConfig) -> KResult<Option<LossOutput>> {
    // f32 stays on the candle path: its whole-batch sums run sequentially in f32, and
    // row-partial sums would move f32 results (by ~1e-6 relative) away from it.
    match cfg.precision.dtype() {
        DType::F64 => run::<f64>(inp, cfg),
        _ => Ok(None),
    }
}

fn run<T: Float>(inp: &LossInputs, cfg: &LossConfig) -> KResult<Option<LossOutput>> {
    let [b, t] = *inp.log_probs.dims() else {
        return Ok(None);
    };
    let same = |x: &Tensor| x.dims() == [b, t] && matches!(x.device(), Device::Cpu);
    if !same(&inp.log_probs) || !same(&inp.mask) {
        return Ok(None);
    }
    for x in [&inp.old_log_probs, &inp.ref_log_probs, &inp.entropy]
        .into_iter()
        .flatten()
    {
        if !same(x) {
            return Ok(None);
        }
    }
    let adv_per_token = match inp.advantages.dims() {
        [n] if *n == b => false,
        [n, 1] if *n == b => false,
        [n, m] if *n == b && *m == t => true,
        _ => return Ok(None),
    };
    if cfg.kl.is_some() && inp.ref_log_probs.is_none() {
        return Ok(None);
    }
    if let PolicyKind::Clip(cp) = &cfg.policy {
        if cp.clip_ratio_c.is_some_and(|c| c <= 1.0) {
            return Ok(None);
        }
    }
    let logp = values::<T>(&inp.log_probs)?;
    let old = match &inp.old_log_probs {
        Some(o) => Some(values::<T>(o)?),
        None => None,
    };
    let mask = values::<T>(&inp.mask)?;
    let adv = values::<T>(&inp.advantages)?;
    let refp = match (&cfg.kl, &inp.ref_log_probs) {
        (Some(_), Some(r)) => Some(values::<T>(r)?),
        _ => None,
    };
    let ent = match &inp.entropy {
        Some(e) => Some(values::<T>(e)?),
        None => None,
    };
    let f = |x: f64| T::from_f64(x);
    let token_clamp = match cfg.ratio_level {
        RatioLevel::Token => cfg.log_ratio_clamp.map(|(lo, hi)| (f(lo), f(hi))),
        _ => None,
    };
    let seq_clamp = cfg.log_ratio_clamp.map(|(lo, hi)| (f(lo), f(hi)));
    let zero = T::zero();
    let one = T::one();

    let row = |i: usize, rr: &mut [T], pp: &mut [T]| -> Row<T> {
        let lp = &logp[i * t..(i + 1) * t];
        let od = old.as_ref().map(|o| &o[i * t..(i + 1) * t]);
        let ms = &mask[i * t..(i + 1) * t];
        let old_at = |j: usize| od.map_or(lp[j], |o| o[j]);
        let adv_at = |j: usize| {
            if adv_per_token {
                adv[i * t + j]
            } else {
                adv[i]
            }
        };
        // Sequence log-ratio (sequence levels only): Σ d·m / clamp(Σ m, 1).
        let seq = if cfg.ratio_level == RatioLevel::Token {
            zero
        } else {
            let mut num = zero;
            let mut len = zero;
            for j in 0..t {
                num += (lp[j] - old_at(j)) * ms[j];
                len += ms[j];
            }
            num / clamp(len, Some(one), None)
        };
        let mut s = Row::zero();
        for j in 0..t {
            let m = ms[j];
            let d = lp[j] - old_at(j);
            let lr = match token_clamp {
                Some((lo, hi)) => clamp(d, Some(lo), Some(hi)),
                None => d,
            };
            let r = match cfg.ratio_level {
                RatioLevel::Token => lr.exp_(),
                RatioLevel::Sequence => match seq_clamp {
                    Some((lo, hi)) => clamp(seq, Some(lo), Some(hi)).exp_(),
                    None => seq.exp_(),
                },
                RatioLevel::GspoToken => {
                    clamp(self_diff(lp[j]) + seq, None, seq_clamp.map(|c| c.1)).exp_()
                }
            };
            let a = adv_at(j);
            let neg_a = -a;
            let mut pt = match &cfg.policy {
                PolicyKind::Clip(cp) => {
                    let (lo, hi) = (f(1.0 - cp.eps_low), f(1.0 + cp.eps_high));
                    let coef = match cp.delta {
                        Some(dl) => clamp(r, None, Some(f(dl))),
                        None => r,
                    };
                    // TRL clip fractions.
                    let low = coef < lo && a < zero;
                    let high = coef > hi && a > zero;
                    let vals = [b2f::<T>(low), b2f(high), b2f(low || high)];
                    if j == 0 {
                        s.first = vals;
                    }
                    s.low += vals[0] * m;
                    s.high += vals[1] * m;
                    s.region += vals[2] * m;
                    // verl clip fractions.
                    let clipped = clamp(r, Some(lo), Some(hi));
                    let vl1 = neg_a * r;
                    let l2 = neg_a * clipped;
                    let mv = |x: T| if m != zero { x } else { zero } * m;
                    s.frac += mv(b2f(l2 > vl1));
                    // ppo_clip.
                    let l1 = neg_a * coef;
                    let clip1 = maximum(l1, l2);
                    match cp.clip_ratio_c {
                        None => clip1,
                        Some(c) => {
                            let l3 = neg_a * f(c) + zero;
                            let vclip1 = maximum(vl1, l2);
                            s.lower += mv(b2f::<T>(vclip1 > l3) * b2f(a < zero));
                            let clip2 = minimum(l3, clip1);
                            if a < zero {
                                clip2
                            } else {
                                clip1
                            }
                        }
                    }
                }
                PolicyKind::ImportanceSampling => neg_a * r,
            };
            s.ppo_kl += if m != zero { -lr } else { zero } * m;
            s.approx += (d * d * f(0.5) + zero) * m;
            s.avg += r * m;
            s.clip += b2f::<T>((r * one + f(-1.0)).abs_() > f(0.2)) * m;
            if let (Some(term), Some(rf)) = (&cfg.kl, &refp) {
                let k = kl_value(lp[j], rf[i * t + j], term.estimator);
                s.k.add(k, m);
                if term.placement == KlPlacement::PerToken {
                    pt += k * f(term.coef) + zero;
                }
            }
            if let Some(e) = &ent {
                s.e.add(e[i * t + j], m);
            }
            s.pt.add(pt, m);
            s.cnt += m;
            rr[j] = r;
            pp[j] = pt;
        }
        s
    };

    let mut ratio = vec![zero; b * t];
    let mut per_token = vec![zero; b * t];
    let rows: Vec<Row<T>> = if t == 0 {
        (0..b).map(|i| row(i, &mut [], &mut [])).collect()
    } else {
        ratio
            .par_chunks_mut(t)
            .zip(per_token.par_chunks_mut(t))
            .enumerate()
            .map(|(i, (rr, pp))| row(i, rr, pp))
            .collect()
    };

    let total = |g: &dyn Fn(&Row<T>) -> T| {
        let mut s = zero;
        for r in &rows {
            s += g(r);
        }
        s
    };
    let cnt = total(&|r| r.cnt);
    let mean_trl = |x: T| (x / clamp(cnt, Some(one), None)).to_f64();
    let mean_verl = |x: T| (x / (cnt * one + f(1e-8))).to_f64();
    let mut metrics = Metrics::default();
    if let PolicyKind::Clip(cp) = &cfg.policy {
        let trl = |k: usize, g: &dyn Fn(&Row<T>) -> T| {
            if cfg.ratio_level == RatioLevel::Sequence {
                let n = b.max(1) as f64;
                total(&|r| r.first[k]).to_f64() / n
            } else {
                mean_trl(total(g))
            }
        };
        metrics.clip_ratio_low = trl(0, &|r| r.low);
        metrics.clip_ratio_high = trl(1, &|r| r.high);
        metrics.clip_ratio_region = trl(2, &|r| r.region);
        metrics.pg_clipfrac = mean_verl(total(&|r| r.frac));
        metrics.pg_clipfrac_lower = match cp.clip_ratio_c {
            Some(_) => mean_verl(total(&|r| r.lower)),
            None => 0.0,
        };
    }
    metrics.ppo_kl = mean_verl(total(&|r| r.ppo_kl));
    metrics.approx_kl = mean_trl(total(&|r| r.approx));
    metrics.avg_ratio = mean_trl(total(&|r| r.avg));
    metrics.clip_frac = mean_trl(total(&|r| r.clip));

    let mut kl_loss = None;
    if let Some(term) = &cfg.kl {
        metrics.kl = Some(mean_trl(total(&|r| r.k.trl)));
        if term.placement == KlPlacement::Separate {
            kl_loss = Some(aggregate(&rows, |r| r.k, cfg.agg, t));
        }
    }
    let pg_loss = aggregate(&rows, |r| r.pt, cfg.agg, t);
    let mut loss = pg_loss;
    if let (Some(kl_loss), Some(term)) = (kl_loss, &cfg.kl) {
        loss += kl_loss * f(term.coef) + zero;
    }
    let mut entropy_loss = None;
    if ent.is_some() {
        let el = aggregate(&rows, |r| r.e, cfg.entropy_agg, t);
        metrics.entropy = Some(mean_trl(total(&|r| r.e.trl)));
        if cfg.entropy_coeff != 0.0 {
            loss -= el * f(cfg.entropy_coeff) + zero;
        }
        entropy_loss = Some(el);
    }
    let dev = &Device::Cpu;
    let scalar = |v: T| Tensor::new(v, dev);
    Ok(Some(LossOutput {
        loss: scalar(loss)?,
        pg_loss: scalar(pg_loss)?,
        kl_loss: kl_loss.map(scalar).transpose()?,
        entropy_loss: entropy_loss.map(scalar).transpose()?,
        ratio: Tensor::from_vec(ratio, (b, t), dev)?,
        per_token_loss: Tensor::from_vec(per_token, (b, t), dev)?,
        metrics,
    }))
}

#[cfg(test)]
mod tests {
    use super::super::aggregate::AggMode;
    use super::super::kl::KlEstimator;
    use super::super::loss::{compute_candle, KlPlacement, KlTerm, LossInputs, LossOutput};
    use super::super::presets::{preset, PRESETS};
    use super::super::{to_f64, to_f64_vec, Precision};
    use super::*;

    fn close(what: &str, a: f64, b: f64) {
        let ok =
            (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
        assert!(ok, "{what}: fused {a} vs candle {b}");
    }

    fn same(ctx: &str, f: &LossOutput, c: &LossOutput) {
        let s = |t: &Tensor| to_f64(t).unwrap_or(f64::NAN);
        close(&format!("{ctx} loss"), s(&f.loss), s(&c.loss));
        close(&format!("{ctx} pg_loss"), s(&f.pg_loss), s(&c.pg_loss));
        let o = |x: &Option<Tensor>| x.as_ref().map(s);
        assert_eq!(
            o(&f.kl_loss).is_some(),
            o(&c.kl_loss).is_some(),
            "{ctx} kl_loss"
        );
        close(
            &format!("{ctx} kl_loss"),
            o(&f.kl_loss).unwrap_or(0.0),
            o(&c.kl_loss).unwrap_or(0.0),
        );
        close(
            &format!("{ctx} ent"),
            o(&f.entropy_loss).unwrap_or(0.0),
            o(&c.entropy_loss).unwrap_or(0.0),
        );
        assert_eq!(f.ratio.dims(), c.ratio.dims(), "{ctx}");
        assert_eq!(f.per_token_loss.dims(), c.per_token_loss.dims(), "{ctx}");
        for (name, x, y) in [
            ("ratio", &f.ratio, &c.ratio),
            ("per_token", &f.per_token_loss, &c.per_token_loss),
        ] {
            let (x, y) = (
                to_f64_vec(x).unwrap_or_default(),
                to_f64_vec(y).unwrap_or_default(),
            );
            assert_eq!(x.len(), y.len(), "{ctx} {name}");
            for (a, b) in x.iter().zip(&y) {
                close(&format!("{ctx} {name}"), *a, *b);
            }
        }
        let (m, n) = (&f.metrics, &c.metrics);
        for (name, a, b) in [
            ("clip_ratio_low", m.clip_ratio_low, n.clip_ratio_low),
            ("clip_ratio_high", m.clip_ratio_high, n.clip_ratio_high),
            (
                "clip_ratio_region",
                m.clip_ratio_region,
                n.clip_ratio_region,
            ),
            ("pg_clipfrac", m.pg_clipfrac, n.pg_clipfrac),
            (
                "pg_clipfrac_lower",
                m.pg_clipfrac_lower,
                n.pg_clipfrac_lower,
            ),
            ("ppo_kl", m.ppo_kl, n.ppo_kl),
            ("approx_kl", m.approx_kl, n.approx_kl),
            ("avg_ratio", m.avg_ratio, n.avg_ratio),
            ("clip_frac", m.clip_frac, n.clip_frac),
        ] {
            close(&format!("{ctx} {name}"), a, b);
        }
        assert_eq!(m.kl.is_some(), n.kl.is_some(), "{ctx} kl");
        assert_eq!(m.entropy.is_some(), n.entropy.is_some(), "{ctx} entropy");
        close(
            &format!("{ctx} kl"),
            m.kl.unwrap_or(0.0),
            n.kl.unwrap_or(0.0),
        );
        close(
            &format!("{ctx} entropy"),
            m.entropy.unwrap_or(0.0),
            n.entropy.unwrap_or(0.0),
        );
    }

    /// Deterministic pseudo-random values in [0, 1).
    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Cases: (name, b, t, log_probs, old, advantages (len b or b·t), mask).
    #[allow(clippy::type_complexity)]
    fn cases() -> Vec<(
        &'static str,
        usize,
        usize,
        Vec<f64>,
        Vec<f64>,
        Vec<f64>,
        Vec<f64>,
    )> {
        let mut out = Vec::new();
        let mut seed = 7u64;
        let (b, t) = (6, 37);
        let mut lp = Vec::new();
        let mut old = Vec::new();
        for _ in 0..b * t {
            let o = -3.0 * lcg(&mut seed) - 1e-3;
            old.push(o);
            lp.push(o + 0.6 * (lcg(&mut seed) - 0.5));
        }
        let adv: Vec<f64> = (0..b).map(|_| 2.0 * lcg(&mut seed) - 1.0).collect();
        // Row 2 empty, row 4 partly masked, others full; row 5 advantage 0.
        let mut mask = vec![1.0; b * t];
        mask[2 * t..3 * t].iter_mut().for_each(|m| *m = 0.0);
        mask[4 * t + 10..5 * t].iter_mut().for_each(|m| *m = 0.0);
        let mut adv0 = adv.clone();
        adv0[5] = 0.0;
        out.push((
            "random+empty-row",
            b,
            t,
            lp.clone(),
            old.clone(),
            adv0,
            mask.clone(),
        ));
        // Clip boundaries: ratios exactly 1 ± 0.2 (log ratios chosen so exp lands on them)
        // and huge log-ratios (exp overflows to inf, under to 0), -inf padding.
        let mut lp2 = lp.clone();
        for (j, v) in [
            0.8f64.ln(),
            1.2f64.ln(),
            0.0,
            800.0,
            -800.0,
            25.0,
            -25.0,
            11.0,
        ]
        .iter()
        .enumerate()
        {
            for i in 0..b {
                lp2[i * t + j] = old[i * t + j] + v;
            }
        }
        lp2[4 * t + 20] = f64::NEG_INFINITY;
        let adv_tok: Vec<f64> = (0..b * t)
            .map(|k| if k % 3 == 0 { -1.0 } else { 0.5 })
            .collect();
        out.push((
            "boundaries+overflow",
            b,
            t,
            lp2.clone(),
            old.clone(),
            adv.clone(),
            mask.clone(),
        ));
        out.push((
            "per-token-adv",
            b,
            t,
            lp2,
            old.clone(),
            adv_tok,
            mask.clone(),
        ));
        out.push((
            "all-masked",
            b,
            t,
            lp.clone(),
            old.clone(),
            adv.clone(),
            vec![0.0; b * t],
        ));
        out.push(("t=0", b, 0, vec![], vec![], adv, vec![]));
        out.push(("b=0", 0, 5, vec![], vec![], vec![], vec![]));
        out
    }

    #[test]
    fn fused_matches_candle_on_every_preset_and_edge_case() -> Result<(), Box<dyn std::error::Error>>
    {
        let dev = &Device::Cpu;
        for (name, b, t, lp, old, adv, mask) in cases() {
            let ent: Vec<f64> = (0..b * t).map(|k| (k % 11) as f64 * 0.3).collect();
            let refp: Vec<f64> = lp
                .iter()
                .enumerate()
                .map(|(k, v)| v - 0.05 * (k % 7) as f64)
                .collect();
            let mk = |v: &Vec<f64>| Tensor::from_vec(v.clone(), (b, t), dev);
            let adv_t = if adv.len() == b * t && t != 1 {
                mk(&adv)?
            } else {
                Tensor::from_vec(adv.clone(), b, dev)?
            };
            for with_old in [true, false] {
                for extras in [false, true] {
                    let inp = LossInputs {
                        log_probs: mk(&lp)?,
                        old_log_probs: with_old.then(|| mk(&old)).transpose()?,
                        ref_log_probs: extras.then(|| mk(&refp)).transpose()?,
                        advantages: adv_t.clone(),
                        mask: mk(&mask)?,
                        entropy: extras.then(|| mk(&ent)).transpose()?,
                    };
                    for p in PRESETS {
                        let mut cfg = preset(p)?;
                        cfg.precision = Precision::F64;
                        let mut cfgs = vec![cfg.clone()];
                        if extras {
                            let ests = [
                                KlEstimator::K1,
                                KlEstimator::Abs,
                                KlEstimator::K2,
                                KlEstimator::K3,
                                KlEstimator::K3Verl,
                                KlEstimator::K3VerlStraightThrough,
                                KlEstimator::MlxRatio,
                            ];
                            for (n, est) in ests.into_iter().enumerate() {
                                let mut c = cfg.clone();
                                c.entropy_coeff = 0.01;
                                c.kl = Some(KlTerm {
                                    estimator: est,
                                    coef: 0.1,
                                    placement: if n % 2 == 0 {
                                        KlPlacement::PerToken
                                    } else {
                                        KlPlacement::Separate
                                    },
                                });
                                cfgs.push(c);
                            }
                            let mut c = cfg.clone();
                            c.agg = AggMode::TrlDapo {
                                num_items_in_batch: Some(7.0),
                            };
                            cfgs.push(c);
                        }
                        for c in cfgs {
                            let ctx = format!("{name} {p} old={with_old} extras={extras}");
                            let f = compute_fused(&inp, &c)?.ok_or("the fused path declined")?;
                            let k = compute_candle(&inp, &c)?;
                            same(&ctx, &f, &k);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn fused_declines_what_candle_refuses() -> Result<(), Box<dyn std::error::Error>> {
        let dev = &Device::Cpu;
        let x = Tensor::zeros((2, 3), DType::F64, dev)?;
        let inp = LossInputs {
            log_probs: x.clone(),
            old_log_probs: Some(Tensor::zeros((2, 4), DType::F64, dev)?),
            ref_log_probs: None,
            advantages: Tensor::zeros(2, DType::F64, dev)?,
            mask: x,
            entropy: None,
        };
        let cfg = preset("trl-grpo")?;
        assert!(compute_fused(&inp, &cfg)?.is_none());
        assert!(super::super::loss::compute(&inp, &cfg).is_err());
        Ok(())
    }
}
