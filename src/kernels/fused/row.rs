//! The row kernel: one pass over a row's tokens computes the ratio, the per-token loss,
//! the KL/entropy terms, the row's sums and, with `GRAD`, the gradient (layout in the
//! module docs of [`super`]).

use std::mem::MaybeUninit;

use super::aggregate::Row;
use super::scalar::{
    agg_entry, b2f, clamp, extremum_grad, kl_exp_arg, kl_term, maximum, minimum, mv, passes,
    self_diff, Float,
};
use crate::kernels::config::{KlPlacement, RatioLevel};
use crate::kernels::kl::KlEstimator;

/// PPO clip parameters in `T`.
#[derive(Clone, Copy)]
pub(super) struct Clip<T> {
    pub(super) lo: T,
    pub(super) hi: T,
    pub(super) delta: Option<T>,
    pub(super) c: Option<T>,
}

/// Tests compare the AVX2 build of the row kernel with the baseline one.
#[cfg(test)]
pub(in crate::kernels) static BASELINE_ONLY: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

#[cfg(test)]
pub(super) fn baseline_only() -> bool {
    BASELINE_ONLY.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(not(test))]
#[inline(always)]
pub(super) fn baseline_only() -> bool {
    false
}

/// What one row pass reads, with the config's scalars in `T`.
pub(super) struct Kernel<'a, T> {
    pub(super) t: usize,
    pub(super) lp: &'a [T],
    pub(super) old: Option<&'a [T]>,
    pub(super) mask: &'a [T],
    pub(super) adv: &'a [T],
    pub(super) adv_per_token: bool,
    pub(super) refp: Option<&'a [T]>,
    pub(super) ent: Option<&'a [T]>,
    pub(super) level: RatioLevel,
    pub(super) token_clamp: Option<(T, T)>,
    pub(super) seq_clamp: Option<(T, T)>,
    pub(super) clip: Option<Clip<T>>,
    pub(super) kl: Option<(KlEstimator, T, KlPlacement)>,
    pub(super) verl: bool,
}

/// Per-row gradient weights: what the aggregated policy term and the separately
/// aggregated KL send to each masked entry of the row.
#[derive(Clone, Copy)]
pub(super) struct RowW<T> {
    pub(super) pt: T,
    pub(super) k: T,
}

/// Tokens per chunk of a row: the `exp`s of a chunk run first, in a loop of calls only,
/// so that the main loop has no calls; chunk partial sums are then folded into the row's
/// (blocked summation, which also keeps f32 sums accurate).
pub(super) const CHUNK: usize = 256;

/// Per-lane partial sums (the fields of [`Row`]).
#[derive(Clone, Copy)]
pub(super) struct Acc<T, const N: usize> {
    pub(super) cnt: [T; N],
    pub(super) pt: [T; N],
    pub(super) pt_v: [T; N],
    pub(super) k: [T; N],
    pub(super) k_v: [T; N],
    pub(super) e: [T; N],
    pub(super) e_v: [T; N],
    pub(super) low: [T; N],
    pub(super) high: [T; N],
    pub(super) region: [T; N],
    pub(super) frac: [T; N],
    pub(super) lower: [T; N],
    pub(super) ppo_kl: [T; N],
    pub(super) approx: [T; N],
    pub(super) avg: [T; N],
    pub(super) clip: [T; N],
}

impl<T: Float, const N: usize> Acc<T, N> {
    fn zero() -> Self {
        let z = [T::zero(); N];
        Acc {
            cnt: z,
            pt: z,
            pt_v: z,
            k: z,
            k_v: z,
            e: z,
            e_v: z,
            low: z,
            high: z,
            region: z,
            frac: z,
            lower: z,
            ppo_kl: z,
            approx: z,
            avg: z,
            clip: z,
        }
    }

    /// Add the lanes into `s` and reset them.
    fn fold_into(&mut self, s: &mut Row<T>) {
        let sum = |x: &[T; N]| {
            let mut v = T::zero();
            for &y in x {
                v += y;
            }
            v
        };
        s.cnt += sum(&self.cnt);
        s.pt.trl += sum(&self.pt);
        s.pt.verl += sum(&self.pt_v);
        s.k.trl += sum(&self.k);
        s.k.verl += sum(&self.k_v);
        s.e.trl += sum(&self.e);
        s.e.verl += sum(&self.e_v);
        s.low += sum(&self.low);
        s.high += sum(&self.high);
        s.region += sum(&self.region);
        s.frac += sum(&self.frac);
        s.lower += sum(&self.lower);
        s.ppo_kl += sum(&self.ppo_kl);
        s.approx += sum(&self.approx);
        s.avg += sum(&self.avg);
        s.clip += sum(&self.clip);
        *self = Acc::zero();
    }
}

/// One row's inputs and per-row constants.
pub(super) struct RowCtx<'r, T> {
    pub(super) lp: &'r [T],
    pub(super) od: Option<&'r [T]>,
    pub(super) ms: &'r [T],
    pub(super) rf: Option<&'r [T]>,
    pub(super) en: Option<&'r [T]>,
    /// The row's advantages (`t` values) or its one advantage.
    pub(super) adv: &'r [T],
    /// Sequence log-ratio (sequence levels).
    pub(super) seq: T,
    /// Whether the sequence ratio's clamp passes the gradient (TRL GSPO).
    pub(super) seq_pass: bool,
    /// GSPO-token's cap on the log-ratio.
    pub(super) gspo_hi: Option<T>,
    pub(super) w: RowW<T>,
}

impl<'a, T: Float> Kernel<'a, T> {
    /// [`Kernel::row`] compiled for AVX2 when the CPU has it (the same IEEE operations on
    /// wider registers, no FMA: bit-identical results, tested).
    pub(super) fn row_dispatch<const GRAD: bool>(
        &self,
        i: usize,
        rr: &mut [MaybeUninit<T>],
        pp: &mut [MaybeUninit<T>],
        gg: &mut [MaybeUninit<T>],
        w: RowW<T>,
    ) -> Row<T> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && !baseline_only() {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { self.row_avx2::<GRAD>(i, rr, pp, gg, w) };
        }
        self.row::<GRAD>(i, rr, pp, gg, w)
    }

    /// [`Kernel::row`] with AVX2 code generation; callers check the CPU first.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn row_avx2<const GRAD: bool>(
        &self,
        i: usize,
        rr: &mut [MaybeUninit<T>],
        pp: &mut [MaybeUninit<T>],
        gg: &mut [MaybeUninit<T>],
        w: RowW<T>,
    ) -> Row<T> {
        self.row::<GRAD>(i, rr, pp, gg, w)
    }

    /// One row: writes the ratio (`rr`), per-token loss (`pp`) and, with `GRAD`, the
    /// gradient (`gg`) of each of its `t` tokens exactly once (every element: the caller
    /// relies on it); returns the row sums.
    #[inline(always)]
    pub(super) fn row<const GRAD: bool>(
        &self,
        i: usize,
        rr: &mut [MaybeUninit<T>],
        pp: &mut [MaybeUninit<T>],
        gg: &mut [MaybeUninit<T>],
        w: RowW<T>,
    ) -> Row<T> {
        let t = self.t;
        let span = i * t..(i + 1) * t;
        let lp = &self.lp[span.clone()];
        let od = self.old.map(|o| &o[span.clone()]);
        let ms = &self.mask[span.clone()];
        let zero = T::zero();
        let one = T::one();
        let old_at = |j: usize| od.map_or(lp[j], |o| o[j]);
        // Sequence log-ratio (sequence levels only): Σ d·m / clamp(Σ m, 1), and what every
        // finite-logp token's ratio then is.
        let (seq, len) = if self.level == RatioLevel::Token {
            (zero, one)
        } else {
            let mut num = zero;
            let mut len = zero;
            for j in 0..t {
                num += (lp[j] - old_at(j)) * ms[j];
                len += ms[j];
            }
            let len = clamp(len, Some(one), None);
            (num / len, len)
        };
        let gspo_hi = self.seq_clamp.map(|c| c.1);
        let (seq_arg, seq_pass) = match (self.level, self.seq_clamp) {
            (RatioLevel::Sequence, Some((lo, hi))) => (
                clamp(seq, Some(lo), Some(hi)),
                passes(seq, Some(lo), Some(hi)),
            ),
            (RatioLevel::GspoToken, _) => (clamp(zero + seq, None, gspo_hi), true),
            _ => (seq, true),
        };
        let seq_r = if self.level == RatioLevel::Token {
            zero
        } else {
            seq_arg.exp_()
        };
        let c = RowCtx {
            lp,
            od,
            ms,
            rf: self.refp.map(|r| &r[span.clone()]),
            en: self.ent.map(|e| &e[span.clone()]),
            adv: if self.adv_per_token {
                &self.adv[span]
            } else {
                &self.adv[i..i + 1]
            },
            seq,
            seq_pass,
            gspo_hi,
            w,
        };
        let kl = match (self.kl, c.rf) {
            (Some((est, ..)), Some(rf)) if kl_exp_arg(zero, zero, est).is_some() => Some((est, rf)),
            _ => None,
        };
        let mut rb = [zero; CHUNK];
        let mut ke = [zero; CHUNK];
        // GSPO with a KL term: the KL part of each token's gradient, until the row sum is
        // known.
        let mut seq_kl = if GRAD && self.level == RatioLevel::Sequence && self.kl.is_some() {
            vec![zero; t]
        } else {
            Vec::new()
        };
        // GSPO's gradient row sum: f64 in token order, as candle's f64 sum (bit-identical);
        // f32 in 8 interleaved partial sums, as accurate as candle's vectorized f32 sum.
        let mut g_seq = [zero; 8];
        let mut s = Row::zero();
        let mut start = 0;
        while start < t {
            let end = (start + CHUNK).min(t);
            // The exps of the chunk: ratios into `rb` (then `rr`), the KL estimator's into `ke`.
            let rb = &mut rb[..end - start];
            match self.level {
                RatioLevel::Token => {
                    for (k, r) in rb.iter_mut().enumerate() {
                        let j = start + k;
                        let d = lp[j] - old_at(j);
                        *r = match self.token_clamp {
                            Some((lo, hi)) => clamp(d, Some(lo), Some(hi)),
                            None => d,
                        }
                        .exp_();
                    }
                }
                RatioLevel::Sequence => rb.fill(seq_r),
                RatioLevel::GspoToken => {
                    for (k, r) in rb.iter_mut().enumerate() {
                        let x = lp[start + k];
                        *r = if x.finite() {
                            seq_r
                        } else {
                            clamp(self_diff(x) + seq, None, gspo_hi).exp_()
                        };
                    }
                }
            }
            for (o, r) in rr[start..end].iter_mut().zip(rb.iter()) {
                o.write(*r);
            }
            if let Some((est, rf)) = kl {
                for j in start..end {
                    ke[j - start] = kl_exp_arg(lp[j], rf[j], est).map_or(zero, |x| x.exp_());
                }
            }
            // 4 f64 or 8 f32 lanes: one AVX2 register (two SSE2 ones) per step.
            if std::mem::size_of::<T>() == 8 {
                self.groups::<4, GRAD>(
                    &c,
                    start,
                    end,
                    rb,
                    &ke,
                    pp,
                    gg,
                    &mut seq_kl,
                    &mut s,
                    &mut g_seq,
                );
            } else {
                self.groups::<8, GRAD>(
                    &c,
                    start,
                    end,
                    rb,
                    &ke,
                    pp,
                    gg,
                    &mut seq_kl,
                    &mut s,
                    &mut g_seq,
                );
            }
            start = end;
        }
        if GRAD && self.level == RatioLevel::Sequence {
            // seq = Σ d·m / len: each token gets (Σ_row g / len)·m.
            let mut total = zero;
            for g in g_seq {
                total += g;
            }
            let g_num = total / len;
            for j in 0..t {
                let g = g_num * ms[j];
                gg[j].write(match seq_kl.get(j) {
                    Some(k) => *k + g,
                    None => g,
                });
            }
        }
        s
    }

    /// Tokens `start..end` of a row (one chunk: ratios in `rb`, KL exps in `ke`, both
    /// indexed from `start`) in groups of `N`, the rest one by one; folds the chunk's sums
    /// into `s`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn groups<const N: usize, const GRAD: bool>(
        &self,
        c: &RowCtx<'_, T>,
        start: usize,
        end: usize,
        rb: &[T],
        ke: &[T],
        pp: &mut [MaybeUninit<T>],
        gg: &mut [MaybeUninit<T>],
        seq_kl: &mut [T],
        s: &mut Row<T>,
        g_seq: &mut [T; 8],
    ) {
        let mut acc = Acc::<T, N>::zero();
        let mut tail = Acc::<T, 1>::zero();
        let mut j = start;
        while j + N <= end {
            let (r, k) = (&rb[j - start..][..N], &ke[j - start..][..N]);
            self.group::<N, GRAD>(c, j, r, k, pp, gg, seq_kl, &mut acc, s, g_seq);
            j += N;
        }
        while j < end {
            let (r, k) = (&rb[j - start..][..1], &ke[j - start..][..1]);
            self.group::<1, GRAD>(c, j, r, k, pp, gg, seq_kl, &mut tail, s, g_seq);
            j += 1;
        }
        acc.fold_into(s);
        tail.fold_into(s);
    }

    /// Tokens `j0..j0 + N` of a row whose ratios are already computed (`rb`, and the KL
    /// exps `ke`, N values each): per-token loss into `pp`, gradient into `gg` (GSPO: its
    /// KL part into `seq_kl`, the rest waits for the row sum `g_seq`, accumulated in token
    /// order), sums into `acc` (and `s.first`).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn group<const N: usize, const GRAD: bool>(
        &self,
        c: &RowCtx<'_, T>,
        j0: usize,
        rb: &[T],
        ke: &[T],
        pp: &mut [MaybeUninit<T>],
        gg: &mut [MaybeUninit<T>],
        seq_kl: &mut [T],
        acc: &mut Acc<T, N>,
        s: &mut Row<T>,
        g_seq: &mut [T; 8],
    ) {
        use std::array::from_fn;
        let z = T::zero();
        let one = T::one();
        let f = |x: f64| T::from_f64(x);
        let (half, m1, p2) = (f(0.5), f(-1.0), f(0.2));
        let x: [T; N] = from_fn(|l| c.lp[j0 + l]);
        let o: [T; N] = match c.od {
            Some(o) => from_fn(|l| o[j0 + l]),
            None => x,
        };
        let m: [T; N] = from_fn(|l| c.ms[j0 + l]);
        let r: [T; N] = from_fn(|l| rb[l]);
        let a: [T; N] = if self.adv_per_token {
            from_fn(|l| c.adv[j0 + l])
        } else {
            [c.adv[0]; N]
        };
        let d: [T; N] = from_fn(|l| x[l] - o[l]);
        let lr: [T; N] = match self.token_clamp {
            Some((lo, hi)) => from_fn(|l| clamp(d[l], Some(lo), Some(hi))),
            None => d,
        };
        let neg_a: [T; N] = from_fn(|l| -a[l]);
        // ppo_clip's intermediates, for its backward.
        let mut l1 = [z; N];
        let mut l2 = [z; N];
        let mut clip1 = [z; N];
        let mut l3 = [z; N];
        let mut clip2 = [z; N];
        let mut pt: [T; N] = match &self.clip {
            Some(cp) => {
                let coef: [T; N] = match cp.delta {
                    Some(dl) => from_fn(|l| clamp(r[l], None, Some(dl))),
                    None => r,
                };
                // TRL clip fractions.
                let low: [T; N] = from_fn(|l| b2f(coef[l] < cp.lo && a[l] < z));
                let high: [T; N] = from_fn(|l| b2f(coef[l] > cp.hi && a[l] > z));
                let region: [T; N] =
                    from_fn(
                        |l| b2f((coef[l] < cp.lo && a[l] < z) || (coef[l] > cp.hi && a[l] > z)),
                    );
                if j0 == 0 {
                    s.first = [low[0], high[0], region[0]];
                }
                for l in 0..N {
                    acc.low[l] += low[l] * m[l];
                    acc.high[l] += high[l] * m[l];
                    acc.region[l] += region[l] * m[l];
                }
                // verl clip fractions.
                let clipped: [T; N] = from_fn(|l| clamp(r[l], Some(cp.lo), Some(cp.hi)));
                let vl1: [T; N] = from_fn(|l| neg_a[l] * r[l]);
                l2 = from_fn(|l| neg_a[l] * clipped[l]);
                for l in 0..N {
                    acc.frac[l] += mv(m[l], b2f(l2[l] > vl1[l]));
                }
                // ppo_clip.
                l1 = from_fn(|l| neg_a[l] * coef[l]);
                clip1 = from_fn(|l| maximum(l1[l], l2[l]));
                match cp.c {
                    None => clip1,
                    Some(cc) => {
                        l3 = from_fn(|l| neg_a[l] * cc + z);
                        for l in 0..N {
                            let vclip1 = maximum(vl1[l], l2[l]);
                            acc.lower[l] += mv(m[l], b2f::<T>(vclip1 > l3[l]) * b2f(a[l] < z));
                        }
                        clip2 = from_fn(|l| minimum(l3[l], clip1[l]));
                        from_fn(|l| if a[l] < z { clip2[l] } else { clip1[l] })
                    }
                }
            }
            None => from_fn(|l| neg_a[l] * r[l]),
        };
        for l in 0..N {
            acc.ppo_kl[l] += mv(m[l], -lr[l]);
            acc.approx[l] += (d[l] * d[l] * half + z) * m[l];
            acc.avg[l] += r[l] * m[l];
            acc.clip[l] += b2f::<T>((r[l] * one + m1).abs_() > p2) * m[l];
        }
        // d(loss)/d(per_token) and the KL term's contribution to d/d(logp).
        let g_pt: [T; N] = match (GRAD, self.verl) {
            (false, _) => [z; N],
            (true, true) => from_fn(|l| agg_entry(true, c.w.pt, m[l])),
            (true, false) => from_fn(|l| agg_entry(false, c.w.pt, m[l])),
        };
        let mut g_kl = [z; N];
        if let (Some((est, coef, place)), Some(rf)) = (self.kl, c.rf) {
            for l in 0..N {
                let g_k = match (GRAD, place) {
                    (false, _) => z,
                    (true, KlPlacement::PerToken) => g_pt[l] * coef + z,
                    (true, KlPlacement::Separate) => agg_entry(self.verl, c.w.k, m[l]),
                };
                let (k, gk) = kl_term::<T, GRAD>(x[l], rf[j0 + l], est, ke[l], g_k);
                g_kl[l] = gk;
                acc.k[l] += k * m[l];
                acc.k_v[l] += mv(m[l], k);
                if place == KlPlacement::PerToken {
                    pt[l] += k * coef + z;
                }
            }
        }
        if let Some(e) = c.en {
            for l in 0..N {
                acc.e[l] += e[j0 + l] * m[l];
                acc.e_v[l] += mv(m[l], e[j0 + l]);
            }
        }
        for l in 0..N {
            acc.pt[l] += pt[l] * m[l];
            acc.pt_v[l] += mv(m[l], pt[l]);
            acc.cnt[l] += m[l];
            pp[j0 + l].write(pt[l]);
        }
        if !GRAD {
            return;
        }
        // Backward of ppo_clip / importance sampling into the ratio: where(A<0) →
        // minimum(l3, clip1) → maximum(l1, l2) → the clamps `min(r, delta)` and
        // `clamp(r, lo, hi)`.
        let g_r: [T; N] = match &self.clip {
            None => from_fn(|l| g_pt[l] * neg_a[l]),
            Some(cp) => {
                let g_c1: [T; N] = match cp.c {
                    None => g_pt,
                    Some(_) => from_fn(|l| {
                        let neg = a[l] < z;
                        let g_c2 = if neg { g_pt[l] } else { z };
                        let g_w = if neg { z } else { g_pt[l] };
                        g_w + extremum_grad(clip2[l], clip1[l], l3[l], g_c2)
                    }),
                };
                let g_r1: [T; N] =
                    from_fn(|l| extremum_grad(clip1[l], l1[l], l2[l], g_c1[l]) * neg_a[l]);
                let g_cl: [T; N] =
                    from_fn(|l| extremum_grad(clip1[l], l2[l], l1[l], g_c1[l]) * neg_a[l]);
                let via1: [T; N] = match cp.delta {
                    Some(dl) => from_fn(|l| if r[l] >= dl { z } else { g_r1[l] }),
                    None => g_r1,
                };
                from_fn(|l| {
                    via1[l]
                        + if passes(r[l], Some(cp.lo), Some(cp.hi)) {
                            g_cl[l]
                        } else {
                            z
                        }
                })
            }
        };
        // Through exp (× its output), then the clamp on its argument.
        let g_pol: [T; N] = match self.level {
            RatioLevel::Token => match self.token_clamp {
                Some((lo, hi)) => from_fn(|l| {
                    if passes(d[l], Some(lo), Some(hi)) {
                        g_r[l] * r[l]
                    } else {
                        z
                    }
                }),
                None => from_fn(|l| g_r[l] * r[l]),
            },
            RatioLevel::GspoToken => from_fn(|l| {
                let gl = if x[l].finite() {
                    z + c.seq
                } else {
                    self_diff(x[l]) + c.seq
                };
                if passes(gl, None, c.gspo_hi) {
                    g_r[l] * r[l]
                } else {
                    z
                }
            }),
            RatioLevel::Sequence => {
                // Broadcast backward: the row sum reaches every token in the row's last
                // sweep.
                for l in 0..N {
                    let g = if c.seq_pass { g_r[l] * r[l] } else { z };
                    let lane = if std::mem::size_of::<T>() == 8 {
                        0
                    } else {
                        (j0 + l) % 8
                    };
                    g_seq[lane] += g;
                }
                [z; N]
            }
        };
        let with_kl = self.kl.is_some() && c.rf.is_some();
        match (self.level, with_kl) {
            (RatioLevel::Sequence, true) => seq_kl[j0..j0 + N].copy_from_slice(&g_kl),
            (RatioLevel::Sequence, false) => {}
            (_, true) => {
                for l in 0..N {
                    gg[j0 + l].write(g_pol[l] + g_kl[l]);
                }
            }
            (_, false) => {
                for l in 0..N {
                    gg[j0 + l].write(g_pol[l]);
                }
            }
        }
    }
}
