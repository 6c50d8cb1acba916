//! Speed of the reference loss kernels on one large micro-batch: 256 rows × 8192 response
//! positions (2 Mi tokens), for the `nexrl-is`, `trl-grpo` and `verl-vanilla` presets, in
//! f64 and f32, loss + metrics and loss + metrics + per-token gradient (candle autograd).
//! Run through `benches/kernels_bench.sh`, which puts the same formulas in PyTorch CPU
//! (`benches/kernels_torch.py`, 2 threads) beside it.
//!
//! Usage: `cargo bench --bench kernels_bench -- [REPEATS] [ROWS] [COLS] [FILTER...]` (filter
//! words such as `trl-grpo`, `f32`, `fwd`, `grad` keep the cases matching all of them).
//! Output: one line per case, `kernels preset=P precision=F mode=M ms=X loss=L`.

use std::time::Instant;

use candle_core::{Device, Tensor};
use rlforensics::kernels::loss::{compute, compute_with_grad, LossInputs};
use rlforensics::kernels::presets::preset;
use rlforensics::kernels::{to_f64, Precision};

/// splitmix64: deterministic inputs without a rand dependency (same stream as
/// `kernels_torch.py`).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `log_probs`, `old_log_probs` `[b, t]`, advantages `[b]`, mask `[b, t]` (row `i` has
/// `t/4 + (i·7919) mod (3t/4)` valid tokens).
fn inputs(b: usize, t: usize) -> LossInputs {
    let mut rng = Rng(20250607);
    let mut old = Vec::with_capacity(b * t);
    let mut new = Vec::with_capacity(b * t);
    for _ in 0..b * t {
        let o = -3.0 * rng.uniform() - 1e-3;
        old.push(o);
        new.push(o + 0.4 * (rng.uniform() - 0.5));
    }
    let adv: Vec<f64> = (0..b).map(|_| 2.0 * rng.uniform() - 1.0).collect();
    let mut mask = vec![0.0; b * t];
    for i in 0..b {
        let n = t / 4 + (i * 7919) % (3 * t / 4);
        mask[i * t..i * t + n].iter_mut().for_each(|m| *m = 1.0);
    }
    let dev = &Device::Cpu;
    let mk = |v: Vec<f64>| Tensor::from_vec(v, (b, t), dev);
    match (mk(new), mk(old), Tensor::from_vec(adv, b, dev), mk(mask)) {
        (Ok(log_probs), Ok(o), Ok(advantages), Ok(mask)) => LossInputs {
            log_probs,
            old_log_probs: Some(o),
            ref_log_probs: None,
            advantages,
            mask,
            entropy: None,
            rollout_log_probs: None,
        },
        _ => {
            eprintln!("kernels_bench: cannot build the input tensors");
            std::process::exit(2);
        }
    }
}

/// Inputs converted once to `dt`, so that the timing is the kernel's, not the cast's.
fn cast(x: &LossInputs, p: Precision) -> candle_core::Result<LossInputs> {
    let dt = p.dtype();
    Ok(LossInputs {
        log_probs: x.log_probs.to_dtype(dt)?,
        old_log_probs: x
            .old_log_probs
            .as_ref()
            .map(|o| o.to_dtype(dt))
            .transpose()?,
        ref_log_probs: None,
        advantages: x.advantages.to_dtype(dt)?,
        mask: x.mask.to_dtype(dt)?,
        entropy: None,
        rollout_log_probs: None,
    })
}

fn main() {
    // benches/kernels_bench.sh sets glibc's MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_
    // for this process and the torch one alike (freed blocks kept for the next call).
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<usize> = raw.iter().filter_map(|a| a.parse().ok()).collect();
    let repeats = args.first().copied().unwrap_or(5).max(1);
    let b = args.get(1).copied().unwrap_or(256);
    let t = args.get(2).copied().unwrap_or(8192);
    // Optional filter: words like `trl-grpo`, `f32`, `fwd` or `grad` keep the cases whose
    // name contains them all.
    // (`cargo bench` adds `--bench`: flags are not filter words.)
    let only: Vec<&String> = raw
        .iter()
        .filter(|a| a.parse::<usize>().is_err() && !a.starts_with("--"))
        .collect();
    let keep = |case: &str| only.iter().all(|w| case.contains(w.as_str()));
    let base = inputs(b, t);
    for name in ["nexrl-is", "trl-grpo", "verl-vanilla"] {
        for precision in [Precision::F64, Precision::F32] {
            let Ok(mut cfg) = preset(name) else {
                eprintln!("kernels_bench: unknown preset {name}");
                std::process::exit(2);
            };
            cfg.precision = precision;
            let x = match cast(&base, precision) {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("kernels_bench: {e}");
                    std::process::exit(2);
                }
            };
            let p = match precision {
                Precision::F64 => "f64",
                Precision::F32 => "f32",
            };
            for mode in ["loss+metrics", "loss+metrics+grad"] {
                let kind = if mode.ends_with("grad") {
                    "grad"
                } else {
                    "fwd"
                };
                if !keep(&format!("{name} {p} {kind}")) {
                    continue;
                }
                let mut best = f64::INFINITY;
                let mut loss = f64::NAN;
                for _ in 0..repeats {
                    let t0 = Instant::now();
                    let out = if mode == "loss+metrics" {
                        compute(&x, &cfg).map(|o| (o, None))
                    } else {
                        compute_with_grad(&x, &cfg).map(|(o, g)| (o, Some(g)))
                    };
                    let ms = t0.elapsed().as_secs_f64() * 1e3;
                    match out {
                        Ok((o, g)) => {
                            std::hint::black_box(&g);
                            loss = to_f64(&o.loss).unwrap_or(f64::NAN);
                        }
                        Err(e) => {
                            eprintln!("kernels_bench: {name}: {e}");
                            std::process::exit(2);
                        }
                    }
                    best = best.min(ms);
                }
                println!(
                    "kernels preset={name} precision={p} mode={mode} ms={best:.2} loss={loss:.9}"
                );
            }
        }
    }
}
