//! `losscheck`: recompute GRPO/GSPO losses from dumped inputs with the reference kernels.
//! Thin: parse arguments, call the library, print, map to an exit code (0 consistent,
//! 1 inconsistent, 2 usage error or unreadable input).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rlforensics::exit_codes::{EXIT_BAD_INPUT, EXIT_CLEAN, EXIT_FOUND};
use rlforensics::kernels::loss::compute_with_grad;
use rlforensics::kernels::presets::{preset, PRESETS};
use rlforensics::kernels::{to_f64, to_f64_vec};
use rlforensics::losscheck::overrides::{apply, Overrides};
use rlforensics::losscheck::{check_tree, inputs_from_value, Status, Tolerance};
use rlforensics::readers::layout::DumpTree;
use rlforensics::Error;

#[derive(Parser, Debug)]
#[command(
    name = "losscheck",
    about = "Recompute GRPO/GSPO losses from dumped inputs and say which side is right"
)]
struct Args {
    /// Dump tree to check: weaver (is_loss_debug/, loss/) or self-hosted (forward_data/, old_log_probs/, trajectory/, loss/).
    #[arg(long = "dump-dir", alias = "dump_dir")]
    dump_dir: Option<PathBuf>,
    /// Free-standing tensors (.safetensors/.pt/.npz/.jsonl): print loss, metrics, gradient.
    #[arg(long)]
    inputs: Option<PathBuf>,
    /// Training step.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    step: i64,
    /// Preset: trl-grpo, trl-bnpo, trl-dr-grpo, trl-dapo, trl-gspo, verl-vanilla, verl-dr-grpo, verl-gspo, nexrl-is, mlx-grpo.
    #[arg(long, default_value = "nexrl-is")]
    preset: String,
    /// Only this rank.
    #[arg(long)]
    rank: Option<u32>,
    /// Only this micro-batch.
    #[arg(long)]
    micro: Option<u32>,
    /// Output format: table (one line per file) or json.
    #[arg(long, default_value = "table")]
    format: String,
    /// Relative tolerance for dumped vs recomputed.
    #[arg(long, default_value_t = 1e-4)]
    rtol: f64,
    /// Absolute tolerance for dumped vs recomputed.
    #[arg(long, default_value_t = 1e-6)]
    atol: f64,
    #[arg(long = "eps-low")]
    eps_low: Option<f64>,
    #[arg(long = "eps-high")]
    eps_high: Option<f64>,
    #[arg(long)]
    delta: Option<f64>,
    #[arg(long = "clip-ratio-c")]
    clip_ratio_c: Option<f64>,
    /// Aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm, grpo, bnpo, dr_grpo, dapo.
    #[arg(long)]
    agg: Option<String>,
    /// token, sequence or gspo-token.
    #[arg(long = "ratio-level")]
    ratio_level: Option<String>,
    /// Symmetric log-ratio clamp (0 = none).
    #[arg(long = "log-ratio-clamp")]
    log_ratio_clamp: Option<f64>,
    /// KL estimator: k1, abs, k2, k3, k3+, k3-trl, mlx.
    #[arg(long)]
    kl: Option<String>,
    #[arg(long = "kl-coef")]
    kl_coef: Option<f64>,
    #[arg(long = "entropy-coeff")]
    entropy_coeff: Option<f64>,
    #[arg(long = "adv-eps")]
    adv_eps: Option<f64>,
    /// f64 (default) or f32.
    #[arg(long)]
    precision: Option<String>,
}

fn run(a: Args) -> Result<u8, Error> {
    let base = preset(&a.preset).map_err(|e| Error::Usage(format!("--preset: {e}")))?;
    let cfg = apply(
        base,
        &Overrides {
            eps_low: a.eps_low,
            eps_high: a.eps_high,
            delta: a.delta,
            clip_ratio_c: a.clip_ratio_c,
            agg: a.agg.clone(),
            ratio_level: a.ratio_level.clone(),
            log_ratio_clamp: a.log_ratio_clamp,
            kl: a.kl.clone(),
            kl_coef: a.kl_coef,
            entropy_coeff: a.entropy_coeff,
            adv_eps: a.adv_eps,
            precision: a.precision.clone(),
        },
    )?;
    let json = a.format == "json";
    match (&a.dump_dir, &a.inputs) {
        (Some(dir), None) => {
            let tree = DumpTree::discover(dir)?;
            let tol = Tolerance {
                rtol: a.rtol,
                atol: a.atol,
            };
            let verdicts = check_tree(&tree, a.step, a.rank, a.micro, &cfg, &tol)?;
            if json {
                let v =
                    serde_json::json!({"schema_version": 1, "preset": cfg, "verdicts": verdicts});
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                for v in &verdicts {
                    println!("{}", v.line());
                }
            }
            let bad = verdicts
                .iter()
                .filter(|v| v.status == Status::Inconsistent)
                .count();
            Ok(if bad > 0 { EXIT_FOUND } else { EXIT_CLEAN })
        }
        (None, Some(file)) => {
            let value = rlforensics::readers::read_any(file)?;
            let inputs = inputs_from_value(&value, file, &cfg)?;
            let (out, grad) = compute_with_grad(&inputs, &cfg)
                .map_err(|e| Error::format(file, rlforensics::Position::File, e.to_string()))?;
            let f = |t: &candle_core::Tensor| to_f64(t).unwrap_or(f64::NAN);
            let shape = grad.dims().to_vec();
            let g = to_f64_vec(&grad).unwrap_or_default();
            let v = serde_json::json!({
                "schema_version": 1,
                "preset": cfg,
                "loss": f(&out.loss),
                "pg_loss": f(&out.pg_loss),
                "kl_loss": out.kl_loss.as_ref().map(f),
                "entropy_loss": out.entropy_loss.as_ref().map(f),
                "metrics": out.metrics,
                "grad_shape": shape,
                "grad": g,
            });
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            Ok(EXIT_CLEAN)
        }
        _ => Err(Error::Usage(format!(
            "give exactly one of --dump-dir DIR or --inputs FILE (presets: {})",
            PRESETS.join(", ")
        ))),
    }
}

fn main() -> ExitCode {
    rlforensics::alloc::keep_freed_memory();
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                EXIT_BAD_INPUT
            } else {
                EXIT_CLEAN
            });
        }
    };
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("losscheck: {err:#}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}
