//! The mismatch metrics the producers log during a run, each under its producer's
//! definition, recomputed from the dumped log-probs of one step so a user can hold them
//! against the dashboard.
//!
//! Notation: `R` is the engine's (rollout) log-prob, `L` the trainer's (verl
//! `old_log_probs`), `m` the response mask, `Δ = L − R` (verl's `log_ratio`, the log of
//! the importance weight π_train/π_rollout). Tokens under the mask where `R` or `L` is not
//! finite (an engine that could not score a token) are left out of every sum and counted
//! ([`Sums::unscored`]), as TRL does (`delta[mask & ~isnan(delta)]`).
//!
//! Sources (each formula below cites its file):
//! - verl 0.9.1 (PyPI wheel `verl-0.9.1-py3-none-any.whl`):
//!   `verl/trainer/ppo/rollout_corr_helper.py` (`compute_offpolicy_metrics`,
//!   `SAFETY_BOUND = 20.0`), `verl/utils/torch_functional.py` (`masked_mean = masked_sum /
//!   (Σm + 1e-8)`, `masked_sum = Σ where(m, x, 0)·m`), `verl/utils/debug/metrics.py`
//!   (`calculate_debug_metrics`: `training/rollout_probs_diff_*`,
//!   `training/rollout_actor_probs_pearson_corr`).
//! - TRL 1.16.0 (PyPI wheel): `trl/trainer/grpo_trainer.py` l.2659–2705 (the importance
//!   ratio `exp(old − sampling)`), l.2862–2895 (`sampling/sampling_logp_difference/{mean,
//!   max}`: per process mean / max of `|old − sampling|` over the mask, then
//!   `gather(...).mean()` / `.max()` over processes; `importance_sampling_ratio/{min,mean,
//!   max}`: `nanmin` / `nanmean` / `nanmax` of the per-process min / mean / max).
//! - OpenRLHF 0.11.2 (PyPI wheel): `openrlhf/models/loss.py` l.215–259 (`vllm_kl =
//!   masked_mean(rollout_log_probs − old_log_probs, action_mask, dim=None)` per
//!   micro-batch), `openrlhf/models/utils.py` (`masked_mean = Σx·m / Σm`, no epsilon).
//! - NeMo-RL, `NVIDIA-NeMo/RL` at `005a098a5fc04317a0ceb792e66a8b8076804618`,
//!   `nemo_rl/algorithms/loss_functions.py` (`ClippedPGLossFn.__call__`:
//!   `masked_mean(exp(|generation − prev| · mask), mask,
//!   global_normalization_factor=global_valid_toks)`, summed over the step's
//!   micro-batches: one token mean over the whole step).
//! - slime, `THUDM/slime` at `2fc48831501c09bde6f6ba1b24576504746e7108`,
//!   `slime/backends/megatron_utils/loss.py` (`train_rollout_logprob_abs_diff =
//!   sum_of_sample_mean(|old − rollout|)`) and `cp_utils.py` (`sum_of_sample_mean = Σ_i
//!   Σ_t x·m / clamp_min(Σ_t m, 1)`), divided by the samples when logged: the mean over
//!   rows of each row's mean.

use std::collections::BTreeMap;

/// verl's `SAFETY_BOUND` on a log-ratio before `exp` (rollout_corr_helper.py).
pub const SAFETY_BOUND: f64 = 20.0;
/// verl's `masked_mean` epsilon (torch_functional.py).
pub const VERL_EPS: f64 = 1e-8;

/// Running co-moments of two series, mergeable (Chan, Golub & LeVeque): the Pearson
/// correlation and the unbiased standard deviation without a second pass.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CoMoments {
    n: f64,
    mx: f64,
    my: f64,
    m2x: f64,
    m2y: f64,
    cxy: f64,
}

impl CoMoments {
    /// Add one pair.
    pub fn push(&mut self, x: f64, y: f64) {
        self.n += 1.0;
        let dx = x - self.mx;
        self.mx += dx / self.n;
        let dy = y - self.my;
        self.my += dy / self.n;
        self.m2x += dx * (x - self.mx);
        self.m2y += dy * (y - self.my);
        self.cxy += dx * (y - self.my);
    }
    /// Merge another run of pairs.
    pub fn merge(&mut self, o: &CoMoments) {
        if o.n == 0.0 {
            return;
        }
        if self.n == 0.0 {
            *self = *o;
            return;
        }
        let n = self.n + o.n;
        let (dx, dy) = (o.mx - self.mx, o.my - self.my);
        let f = self.n * o.n / n;
        self.m2x += o.m2x + dx * dx * f;
        self.m2y += o.m2y + dy * dy * f;
        self.cxy += o.cxy + dx * dy * f;
        self.mx += dx * o.n / n;
        self.my += dy * o.n / n;
        self.n = n;
    }
    /// Mean of x.
    pub fn mean_x(&self) -> f64 {
        if self.n == 0.0 {
            f64::NAN
        } else {
            self.mx
        }
    }
    /// Unbiased standard deviation of x (torch `std`), NaN below two values.
    pub fn std_x(&self) -> f64 {
        (self.m2x / (self.n - 1.0)).sqrt()
    }
    /// Pearson correlation of x and y (torch `corrcoef`).
    pub fn pearson(&self) -> f64 {
        self.cxy / (self.m2x * self.m2y).sqrt()
    }
}

/// Token and row sums of one cell (or a merge of cells) from which every producer metric
/// follows. Merge cells in (rank, micro) order for reproducible rounding.
#[derive(Debug, Clone, PartialEq)]
pub struct Sums {
    /// Tokens compared (`Σm` over scored tokens).
    pub n: f64,
    /// Masked tokens with a non-finite log-prob on either side, left out.
    pub unscored: u64,
    /// `Σ (R − L)`.
    pub s_r_minus_l: f64,
    /// `Σ exp(Δ) − Δ − 1` (verl `k3_kl`, unclamped).
    pub s_k3: f64,
    /// `Σ exp(2·clamp(Δ, ±20))` (verl `chi2_token`).
    pub s_rho2: f64,
    /// `Σ |Δ|`.
    pub s_abs: f64,
    /// `max |Δ|`.
    pub max_abs: f64,
    /// `Σ exp(|Δ|)` (NeMo-RL).
    pub s_mult: f64,
    /// `Σ exp(Δ)`, `min`, `max` (raw token importance ratio; TRL).
    pub s_w: f64,
    /// Smallest raw ratio.
    pub min_w: f64,
    /// Largest raw ratio.
    pub max_w: f64,
    /// `(exp L, exp R)` co-moments (verl's Pearson correlation).
    pub probs: CoMoments,
    /// `|exp L − exp R|` moments (`x`; `y` unused).
    pub prob_diff: CoMoments,
    /// `max |exp L − exp R|`.
    pub max_prob_diff: f64,
    /// Rows seen (every row, empty ones included: verl's row means run over all rows).
    pub rows: f64,
    /// Row sums of `exp(−mean L)`, `−mean L`, `exp(−mean R)`, `−mean R`.
    pub s_ppl_l: f64,
    /// See [`Sums::s_ppl_l`].
    pub s_logppl_l: f64,
    /// See [`Sums::s_ppl_l`].
    pub s_ppl_r: f64,
    /// See [`Sums::s_ppl_l`].
    pub s_logppl_r: f64,
    /// Row sums of `log_ppl_diff = mean R − mean L`, its absolute value, its exp.
    pub s_lpd: f64,
    /// See [`Sums::s_lpd`].
    pub s_abs_lpd: f64,
    /// See [`Sums::s_lpd`].
    pub s_ppl_ratio: f64,
    /// Row extremes of `log_ppl_diff`.
    pub max_lpd: f64,
    /// See [`Sums::max_lpd`].
    pub min_lpd: f64,
    /// Row sum of `exp(2·clamp(Σ_t Δ, ±20))` (verl `chi2_seq`).
    pub s_rho2_seq: f64,
    /// Row sum of `Σ_t |Δ| / max(Σ_t m, 1)` (slime).
    pub s_row_abs_mean: f64,
}

impl Default for Sums {
    fn default() -> Self {
        Sums {
            n: 0.0,
            unscored: 0,
            s_r_minus_l: 0.0,
            s_k3: 0.0,
            s_rho2: 0.0,
            s_abs: 0.0,
            max_abs: f64::NEG_INFINITY,
            s_mult: 0.0,
            s_w: 0.0,
            min_w: f64::INFINITY,
            max_w: f64::NEG_INFINITY,
            probs: CoMoments::default(),
            prob_diff: CoMoments::default(),
            max_prob_diff: f64::NEG_INFINITY,
            rows: 0.0,
            s_ppl_l: 0.0,
            s_logppl_l: 0.0,
            s_ppl_r: 0.0,
            s_logppl_r: 0.0,
            s_lpd: 0.0,
            s_abs_lpd: 0.0,
            s_ppl_ratio: 0.0,
            max_lpd: f64::NEG_INFINITY,
            min_lpd: f64::INFINITY,
            s_rho2_seq: 0.0,
            s_row_abs_mean: 0.0,
        }
    }
}

/// One row's running sums, closed into [`Sums`] by [`Sums::end_row`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RowSums {
    /// Tokens.
    pub n: f64,
    /// `Σ L`.
    pub s_l: f64,
    /// `Σ R`.
    pub s_r: f64,
    /// `Σ Δ`.
    pub s_d: f64,
    /// `Σ |Δ|`.
    pub s_abs: f64,
}

impl Sums {
    /// Add one scored token: engine log-prob `r`, trainer log-prob `l`, into the step sums
    /// and the row's.
    #[inline]
    pub fn push(&mut self, row: &mut RowSums, r: f64, l: f64) {
        let d = l - r;
        let ad = d.abs();
        let e = d.exp();
        self.n += 1.0;
        self.s_r_minus_l += r - l;
        self.s_k3 += e - d - 1.0;
        // exp(2·clamp(Δ)) = e² inside the bound; exp(|Δ|) = e or 1/e (three exps a token).
        self.s_rho2 += if ad <= SAFETY_BOUND {
            e * e
        } else {
            (2.0 * d.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp()
        };
        self.s_abs += ad;
        self.max_abs = self.max_abs.max(ad);
        self.s_mult += if d >= 0.0 { e } else { 1.0 / e };
        self.s_w += e;
        self.min_w = self.min_w.min(e);
        self.max_w = self.max_w.max(e);
        let (p, q) = (l.exp(), r.exp());
        self.probs.push(p, q);
        let dp = (p - q).abs();
        self.prob_diff.push(dp, 0.0);
        self.max_prob_diff = self.max_prob_diff.max(dp);
        row.n += 1.0;
        row.s_l += l;
        row.s_r += r;
        row.s_d += d;
        row.s_abs += ad;
    }

    /// Close a row (every row counts, an empty one too, as verl's row means do).
    pub fn end_row(&mut self, row: &RowSums) {
        let ml = row.s_l / (row.n + VERL_EPS);
        let mr = row.s_r / (row.n + VERL_EPS);
        self.rows += 1.0;
        self.s_ppl_l += (-ml).exp();
        self.s_logppl_l += -ml;
        self.s_ppl_r += (-mr).exp();
        self.s_logppl_r += -mr;
        let lpd = mr - ml;
        self.s_lpd += lpd;
        self.s_abs_lpd += lpd.abs();
        self.s_ppl_ratio += lpd.exp();
        self.max_lpd = self.max_lpd.max(lpd);
        self.min_lpd = self.min_lpd.min(lpd);
        self.s_rho2_seq += (2.0 * row.s_d.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp();
        self.s_row_abs_mean += row.s_abs / row.n.max(1.0);
    }

    /// Merge another cell's sums.
    pub fn merge(&mut self, o: &Sums) {
        self.n += o.n;
        self.unscored += o.unscored;
        self.s_r_minus_l += o.s_r_minus_l;
        self.s_k3 += o.s_k3;
        self.s_rho2 += o.s_rho2;
        self.s_abs += o.s_abs;
        self.max_abs = self.max_abs.max(o.max_abs);
        self.s_mult += o.s_mult;
        self.s_w += o.s_w;
        self.min_w = self.min_w.min(o.min_w);
        self.max_w = self.max_w.max(o.max_w);
        self.probs.merge(&o.probs);
        self.prob_diff.merge(&o.prob_diff);
        self.max_prob_diff = self.max_prob_diff.max(o.max_prob_diff);
        self.rows += o.rows;
        self.s_ppl_l += o.s_ppl_l;
        self.s_logppl_l += o.s_logppl_l;
        self.s_ppl_r += o.s_ppl_r;
        self.s_logppl_r += o.s_logppl_r;
        self.s_lpd += o.s_lpd;
        self.s_abs_lpd += o.s_abs_lpd;
        self.s_ppl_ratio += o.s_ppl_ratio;
        self.max_lpd = self.max_lpd.max(o.max_lpd);
        self.min_lpd = self.min_lpd.min(o.min_lpd);
        self.s_rho2_seq += o.s_rho2_seq;
        self.s_row_abs_mean += o.s_row_abs_mean;
    }

    /// verl `masked_mean` of a token sum.
    fn verl_mean(&self, s: f64) -> f64 {
        s / (self.n + VERL_EPS)
    }
}

/// A max that is NaN when nothing was seen.
fn seen(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        f64::NAN
    }
}

/// verl's `rollout_corr/*` metrics of `compute_offpolicy_metrics` and the
/// `training/rollout_*` debug metrics, over the whole step (verl computes them on the
/// step's batch in the driver).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct VerlMetrics {
    /// `rollout_corr/kl = masked_mean(R − L)`.
    pub kl: f64,
    /// `rollout_corr/k3_kl = masked_mean(exp(Δ) − Δ − 1)`.
    pub k3_kl: f64,
    /// `rollout_corr/training_ppl = mean_rows exp(−masked_mean_row(L))`.
    pub training_ppl: f64,
    /// `rollout_corr/training_log_ppl = mean_rows(−masked_mean_row(L))`.
    pub training_log_ppl: f64,
    /// `rollout_corr/rollout_ppl`.
    pub rollout_ppl: f64,
    /// `rollout_corr/rollout_log_ppl`.
    pub rollout_log_ppl: f64,
    /// `rollout_corr/log_ppl_diff = mean_rows(mean_row R − mean_row L)`.
    pub log_ppl_diff: f64,
    /// `rollout_corr/log_ppl_abs_diff`.
    pub log_ppl_abs_diff: f64,
    /// `rollout_corr/log_ppl_diff_max`.
    pub log_ppl_diff_max: f64,
    /// `rollout_corr/log_ppl_diff_min`.
    pub log_ppl_diff_min: f64,
    /// `rollout_corr/ppl_ratio = mean_rows exp(log_ppl_diff_row)`.
    pub ppl_ratio: f64,
    /// `rollout_corr/chi2_token = masked_mean(exp(2·clamp(Δ, ±20))) − 1`.
    pub chi2_token: f64,
    /// `rollout_corr/chi2_seq = mean_rows exp(2·clamp(Σ_t Δ, ±20)) − 1`.
    pub chi2_seq: f64,
    /// `training/rollout_probs_diff_max = max |exp L − exp R|`.
    pub rollout_probs_diff_max: f64,
    /// `training/rollout_probs_diff_mean`.
    pub rollout_probs_diff_mean: f64,
    /// `training/rollout_probs_diff_std` (torch `std`: unbiased).
    pub rollout_probs_diff_std: f64,
    /// `training/rollout_actor_probs_pearson_corr` (`corrcoef(exp L, exp R)`).
    pub rollout_actor_probs_pearson_corr: f64,
}

/// TRL's `sampling/*` metrics: per process (a rank's cells merged), then across processes.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct TrlMetrics {
    /// `sampling/sampling_logp_difference/mean`: mean over ranks of each rank's mean `|Δ|`.
    pub sampling_logp_difference_mean: f64,
    /// `sampling/sampling_logp_difference/max`: max over ranks of each rank's max `|Δ|`.
    pub sampling_logp_difference_max: f64,
    /// `sampling/importance_sampling_ratio/min` of the raw token ratio `exp(Δ)`.
    pub importance_sampling_ratio_min: f64,
    /// `sampling/importance_sampling_ratio/mean`: mean over ranks of each rank's mean.
    pub importance_sampling_ratio_mean: f64,
    /// `sampling/importance_sampling_ratio/max`.
    pub importance_sampling_ratio_max: f64,
}

/// Every producer's metrics of one step.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ProducerMetrics {
    /// verl.
    pub verl: VerlMetrics,
    /// TRL (processes = the step's ranks).
    pub trl: TrlMetrics,
    /// OpenRLHF `vllm_kl`: the mean over micro-batches (cells with a token) of each
    /// micro's `Σ(R − L)·m / Σm`.
    pub openrlhf_vllm_kl: f64,
    /// NeMo-RL `train/token_mult_prob_error = Σ exp(|Δ|)·m / Σm` over the step.
    pub nemo_rl_token_mult_prob_error: f64,
    /// slime `train/train_rollout_logprob_abs_diff`: mean over rows of each row's mean `|Δ|`.
    pub slime_train_rollout_logprob_abs_diff: f64,
}

impl ProducerMetrics {
    /// The metrics from the step's sums, its per-rank sums and its per-cell sums.
    pub fn from_sums(all: &Sums, ranks: &BTreeMap<usize, Sums>, cells: &[Sums]) -> Self {
        let verl = VerlMetrics {
            kl: all.verl_mean(all.s_r_minus_l),
            k3_kl: all.verl_mean(all.s_k3),
            training_ppl: all.s_ppl_l / all.rows,
            training_log_ppl: all.s_logppl_l / all.rows,
            rollout_ppl: all.s_ppl_r / all.rows,
            rollout_log_ppl: all.s_logppl_r / all.rows,
            log_ppl_diff: all.s_lpd / all.rows,
            log_ppl_abs_diff: all.s_abs_lpd / all.rows,
            log_ppl_diff_max: seen(all.max_lpd),
            log_ppl_diff_min: seen(all.min_lpd),
            ppl_ratio: all.s_ppl_ratio / all.rows,
            chi2_token: all.verl_mean(all.s_rho2) - 1.0,
            chi2_seq: all.s_rho2_seq / all.rows - 1.0,
            rollout_probs_diff_max: seen(all.max_prob_diff),
            rollout_probs_diff_mean: all.prob_diff.mean_x(),
            rollout_probs_diff_std: all.prob_diff.std_x(),
            rollout_actor_probs_pearson_corr: all.probs.pearson(),
        };
        let per_rank: Vec<&Sums> = ranks.values().filter(|s| s.n > 0.0).collect();
        let k = per_rank.len() as f64;
        let trl = TrlMetrics {
            sampling_logp_difference_mean: per_rank.iter().map(|s| s.s_abs / s.n).sum::<f64>() / k,
            sampling_logp_difference_max: seen(
                per_rank
                    .iter()
                    .map(|s| s.max_abs)
                    .fold(f64::NEG_INFINITY, f64::max),
            ),
            importance_sampling_ratio_min: seen(
                per_rank
                    .iter()
                    .map(|s| s.min_w)
                    .fold(f64::INFINITY, f64::min),
            ),
            importance_sampling_ratio_mean: per_rank.iter().map(|s| s.s_w / s.n).sum::<f64>() / k,
            importance_sampling_ratio_max: seen(
                per_rank
                    .iter()
                    .map(|s| s.max_w)
                    .fold(f64::NEG_INFINITY, f64::max),
            ),
        };
        let micro: Vec<f64> = cells
            .iter()
            .filter(|s| s.n > 0.0)
            .map(|s| s.s_r_minus_l / s.n)
            .collect();
        ProducerMetrics {
            verl,
            trl,
            openrlhf_vllm_kl: micro.iter().sum::<f64>() / micro.len() as f64,
            nemo_rl_token_mult_prob_error: all.s_mult / all.n,
            slime_train_rollout_logprob_abs_diff: all.s_row_abs_mean / all.rows,
        }
    }

    /// Every metric under the name its producer logs it, in a fixed order.
    pub fn named(&self) -> Vec<(&'static str, f64)> {
        let v = &self.verl;
        let t = &self.trl;
        vec![
            ("rollout_corr/kl", v.kl),
            ("rollout_corr/k3_kl", v.k3_kl),
            ("rollout_corr/training_ppl", v.training_ppl),
            ("rollout_corr/training_log_ppl", v.training_log_ppl),
            ("rollout_corr/rollout_ppl", v.rollout_ppl),
            ("rollout_corr/rollout_log_ppl", v.rollout_log_ppl),
            ("rollout_corr/log_ppl_diff", v.log_ppl_diff),
            ("rollout_corr/log_ppl_abs_diff", v.log_ppl_abs_diff),
            ("rollout_corr/log_ppl_diff_max", v.log_ppl_diff_max),
            ("rollout_corr/log_ppl_diff_min", v.log_ppl_diff_min),
            ("rollout_corr/ppl_ratio", v.ppl_ratio),
            ("rollout_corr/chi2_token", v.chi2_token),
            ("rollout_corr/chi2_seq", v.chi2_seq),
            ("training/rollout_probs_diff_max", v.rollout_probs_diff_max),
            (
                "training/rollout_probs_diff_mean",
                v.rollout_probs_diff_mean,
            ),
            ("training/rollout_probs_diff_std", v.rollout_probs_diff_std),
            (
                "training/rollout_actor_probs_pearson_corr",
                v.rollout_actor_probs_pearson_corr,
            ),
            (
                "sampling/sampling_logp_difference/mean",
                t.sampling_logp_difference_mean,
            ),
            (
                "sampling/sampling_logp_difference/max",
                t.sampling_logp_difference_max,
            ),
            (
                "sampling/importance_sampling_ratio/min",
                t.importance_sampling_ratio_min,
            ),
            (
                "sampling/importance_sampling_ratio/mean",
                t.importance_sampling_ratio_mean,
            ),
            (
                "sampling/importance_sampling_ratio/max",
                t.importance_sampling_ratio_max,
            ),
            ("vllm_kl", self.openrlhf_vllm_kl),
            (
                "train/token_mult_prob_error",
                self.nemo_rl_token_mult_prob_error,
            ),
            (
                "train/train_rollout_logprob_abs_diff",
                self.slime_train_rollout_logprob_abs_diff,
            ),
        ]
    }
}

/// Older or prefixed spellings of the metrics, as logs carry them, mapped to the names of
/// [`ProducerMetrics::named`]: verl before `rollout_corr/` logged `mismatch/mismatch_*`
/// (verl's `mismatch_helper.py`, `compute_mismatch_metrics`); trackers prefix `actor/`,
/// `train/`; TRL logs `train/`-less names on the console.
pub const ALIASES: &[(&str, &str)] = &[
    ("mismatch/mismatch_kl", "rollout_corr/kl"),
    ("mismatch/mismatch_k3_kl", "rollout_corr/k3_kl"),
    (
        "mismatch/mismatch_training_ppl",
        "rollout_corr/training_ppl",
    ),
    (
        "mismatch/mismatch_training_log_ppl",
        "rollout_corr/training_log_ppl",
    ),
    ("mismatch/mismatch_rollout_ppl", "rollout_corr/rollout_ppl"),
    (
        "mismatch/mismatch_rollout_log_ppl",
        "rollout_corr/rollout_log_ppl",
    ),
    (
        "mismatch/mismatch_log_ppl_diff",
        "rollout_corr/log_ppl_diff",
    ),
    (
        "mismatch/mismatch_log_ppl_abs_diff",
        "rollout_corr/log_ppl_abs_diff",
    ),
    (
        "mismatch/mismatch_log_ppl_diff_max",
        "rollout_corr/log_ppl_diff_max",
    ),
    (
        "mismatch/mismatch_log_ppl_diff_min",
        "rollout_corr/log_ppl_diff_min",
    ),
    ("mismatch/mismatch_ppl_ratio", "rollout_corr/ppl_ratio"),
    ("mismatch/mismatch_chi2_token", "rollout_corr/chi2_token"),
    ("mismatch/mismatch_chi2_seq", "rollout_corr/chi2_seq"),
    ("actor/vllm_kl", "vllm_kl"),
    ("token_mult_prob_error", "train/token_mult_prob_error"),
    (
        "train_rollout_logprob_abs_diff",
        "train/train_rollout_logprob_abs_diff",
    ),
    (
        "train/sampling/sampling_logp_difference/mean",
        "sampling/sampling_logp_difference/mean",
    ),
    (
        "train/sampling/sampling_logp_difference/max",
        "sampling/sampling_logp_difference/max",
    ),
];

/// The name of [`ProducerMetrics::named`] a logged metric name means, if any: itself, an
/// alias of [`ALIASES`], or either behind a tracker prefix (`actor/`, `train/`).
pub fn canonical(name: &str) -> Option<&'static str> {
    let known = |n: &str| -> Option<&'static str> {
        ProducerMetrics::default()
            .named()
            .into_iter()
            .map(|(k, _)| k)
            .find(|k| *k == n)
            .or_else(|| ALIASES.iter().find(|(a, _)| *a == n).map(|(_, c)| *c))
    };
    known(name).or_else(|| {
        ["actor/", "train/", "training/"]
            .iter()
            .find_map(|p| name.strip_prefix(p).and_then(known))
    })
}
