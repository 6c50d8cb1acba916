//! `losscheck`'s command line: recompute GRPO/GSPO losses from dumped inputs with the
//! reference kernels. Parses arguments, calls the library, prints, maps to an exit code
//! (0 consistent, 1 inconsistent, 2 usage error or unreadable input). The binary is a shim
//! over [`run_cli`].

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;

use crate::cli::{self, CommonFlags, FailOn, Format};
use crate::exit_codes::{EXIT_CLEAN, EXIT_FOUND};
use crate::kernels::presets::{preset, PRESETS};
use crate::losscheck::overrides::{apply, Overrides};
use crate::losscheck::report::{InputsReport, Report, TreeReport};
use crate::losscheck::{check_tree_inferred, inputs_from_value, Tolerance};
use crate::producers::layout::{without_unreadable, DumpTree, Kind};
use crate::render::{self, Renderer, Style};
use crate::Error;
use clap::Parser;

/// The end of `--help`: invocations on a user's own dumps, one on the shipped fixtures
/// (in a clone of the repository), then the exit codes.
fn help_tail() -> String {
    cli::help_tail(&[
        "losscheck --dump-dir run_b/debug_dump --step 12",
        "losscheck verl_batches/ --step 12 --logs metrics.jsonl",
        "losscheck --inputs my_batch.safetensors --preset trl-grpo --eps-high 0.28 --format json --output loss.json",
        "losscheck --dump-dir fixtures/dumps/weaver_faulty_pt --step 0",
    ])
}

#[derive(Parser, Debug)]
#[command(
    name = "losscheck",
    version,
    about = "Recompute GRPO/GSPO losses from dumped inputs and say which side is right",
    after_help = help_tail()
)]
struct Args {
    /// A dump to check, whatever its producer: a NexRL tree is checked as with --dump-dir;
    /// a verl / slime / Miles / NeMo-RL dump (which holds the loss inputs but no loss) has
    /// its loss recomputed under that stack's documented defaults (--preset overrides) and
    /// compared with --logs.
    #[arg(value_name = "DUMP")]
    dump: Option<PathBuf>,
    /// With DUMP of another stack: its metrics log (JSONL, one record per step with `step`),
    /// whose logged loss (verl `actor/pg_loss`, slime `train/pg_loss`) is compared with the
    /// recomputed one.
    #[arg(long, value_name = "FILE")]
    logs: Option<PathBuf>,
    /// With DUMP: a TOML mapping of an in-house layout (docs/stacks.md), the DUMP read with
    /// it; a `loss`/`pg_loss` it maps is checked against the recomputed one (give --preset).
    #[arg(long, value_name = "FILE")]
    mapping: Option<PathBuf>,
    /// Dump tree to check: weaver (is_loss_debug/, loss/) or self-hosted (forward_data/,
    /// old_log_probs/, trajectory/, loss/).
    #[arg(long = "dump-dir", alias = "dump_dir", value_name = "DIR")]
    dump_dir: Option<PathBuf>,
    /// Free-standing tensors (.safetensors/.pt/.npz/.jsonl; `-` reads stdin): print the
    /// loss, its terms, the metrics and a gradient summary (every element with --format json).
    #[arg(long, value_name = "FILE")]
    inputs: Option<PathBuf>,
    /// Training step to check. Default: the only step with a dumped loss (loss/ or
    /// is_loss_debug/; a step without one, e.g. a validation-only step -1, is not counted);
    /// required when several steps have one.
    #[arg(long, allow_hyphen_values = true, value_name = "N")]
    step: Option<i64>,
    /// Preset: trl-grpo, trl-bnpo, trl-dr-grpo, trl-dapo, trl-gspo, verl-vanilla,
    /// verl-dr-grpo, verl-gspo, nexrl-is, mlx-grpo.
    /// Given explicitly, it also fixes the aggregation, KL term and advantage epsilon
    /// (otherwise read from the dump's extra_info or inferred; default nexrl-is).
    #[arg(long)]
    preset: Option<String>,
    /// Only this rank.
    #[arg(long, value_name = "R")]
    rank: Option<u32>,
    /// Only this micro-batch.
    #[arg(long, value_name = "M")]
    micro: Option<u32>,
    /// Format of stdout.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Also write the JSON report (with schema_version) to FILE.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Lowest severity that makes the exit code 1; an inconsistent loss is an error
    /// (--fail-on critical reports it and exits 0), a total that cannot be judged for want of
    /// its coefficients (undetermined) a warning.
    #[arg(long, value_enum, default_value = "error")]
    fail_on: FailOn,
    /// Relative tolerance for dumped vs recomputed.
    #[arg(long, default_value_t = 1e-4, value_name = "X")]
    rtol: f64,
    /// Absolute tolerance for dumped vs recomputed.
    #[arg(long, default_value_t = 1e-6, value_name = "X")]
    atol: f64,
    /// Lower clip epsilon: the ratio is clipped below at 1 − eps_low.
    #[arg(long = "eps-low", value_name = "X")]
    eps_low: Option<f64>,
    /// Upper clip epsilon: the ratio is clipped above at 1 + eps_high.
    #[arg(long = "eps-high", value_name = "X")]
    eps_high: Option<f64>,
    /// TRL's upper bound on the ratio of the unclipped term (two-sided clipping).
    #[arg(long, value_name = "X")]
    delta: Option<f64>,
    /// Dual-clip constant c (> 1): bounds the loss of negative-advantage tokens.
    #[arg(long = "clip-ratio-c", value_name = "X")]
    clip_ratio_c: Option<f64>,
    /// Aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum,
    /// seq-mean-token-sum-norm, grpo, bnpo, dr_grpo, dapo.
    #[arg(long, value_name = "MODE")]
    agg: Option<String>,
    /// token, sequence or gspo-token.
    #[arg(long = "ratio-level", value_name = "LEVEL")]
    ratio_level: Option<String>,
    /// Symmetric log-ratio clamp (0 = none).
    #[arg(long = "log-ratio-clamp", value_name = "X")]
    log_ratio_clamp: Option<f64>,
    /// KL estimator: k1, abs, k2, k3, k3+, k3-trl, mlx.
    #[arg(long, value_name = "NAME")]
    kl: Option<String>,
    /// Weight of the KL term added to the loss (0 = no KL term).
    #[arg(long = "kl-coef", alias = "kl-coeff", value_name = "X")]
    kl_coef: Option<f64>,
    /// Weight of the entropy bonus subtracted from the loss (0 = none).
    #[arg(long = "entropy-coeff", value_name = "X")]
    entropy_coeff: Option<f64>,
    /// Epsilon added to the group reward std when advantages are normalised.
    #[arg(long = "adv-eps", alias = "advantage-eps", value_name = "X")]
    adv_eps: Option<f64>,
    /// f64 (default) or f32.
    #[arg(long, value_name = "P")]
    precision: Option<String>,
    #[command(flatten)]
    common: CommonFlags,
}

/// The step to check: `--step`, else the tree's only step with a dumped loss (a `loss/` or
/// `is_loss_debug/` file): a step without one, such as the validation-only step −1 a trainer
/// dumps trajectories for before training, has nothing to check and is not a candidate.
/// A tree with no dumped loss at all falls back to its only step (whose check then says
/// what is missing).
fn step_of(tree: &DumpTree, step: Option<i64>) -> Result<i64, Error> {
    if let Some(s) = step {
        return Ok(s);
    }
    let with_loss: BTreeSet<i64> = tree
        .files()
        .iter()
        .filter(|f| matches!(f.kind, Kind::Loss | Kind::IsLossDebug))
        .map(|f| f.step)
        .collect();
    let all = tree.steps();
    let candidates = if with_loss.is_empty() {
        &all
    } else {
        &with_loss
    };
    let list = |steps: &BTreeSet<i64>| {
        steps
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match candidates.len() {
        1 => Ok(*candidates.iter().next().unwrap_or(&0)),
        0 => Err(Error::input(
            &tree.root,
            "no dump file (step_NNNNNN…) in this tree",
        )),
        _ if with_loss.is_empty() => Err(Error::Usage(format!(
            "{}: holds steps {}; pick one with --step N",
            tree.root.display(),
            list(&all)
        ))),
        _ => Err(Error::Usage(format!(
            "{}: holds a dumped loss for steps {}; pick one with --step N",
            tree.root.display(),
            list(&with_loss)
        ))),
    }
}

/// The loss flags given on the command line (eps, aggregation, KL…), over a preset.
fn overrides(a: &Args) -> Overrides {
    Overrides {
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
        preset_fixes_composition: false,
    }
}

/// Check, write `--output`, and return stdout's text and the exit code; with
/// `stderr_notes` (the binary's door) each file set aside as unreadable is named on stderr.
fn run(a: &Args, stderr_notes: bool) -> Result<(String, u8), Error> {
    if let Some(out) = stack_run(a)? {
        return Ok(out);
    }
    let base = preset(a.preset.as_deref().unwrap_or("nexrl-is"))
        .map_err(|e| Error::Usage(format!("--preset: {e}")))?;
    let given = overrides(a);
    let cfg = apply(base, &given)?;
    let given = Overrides {
        preset_fixes_composition: a.preset.is_some(),
        ..given
    };
    let dump_dir = a.dump_dir.as_ref().or(a.dump.as_ref());
    let report = match (dump_dir, &a.inputs) {
        (Some(dir), None) => {
            let role = DumpTree::discover(dir)?.producer.to_string();
            let tol = Tolerance::self_consistency(a.atol, a.rtol);
            // One bad file never sinks the run: it is set aside (named, with its reason)
            // and every other cell judged; the exit code is then 2.
            let (checked, unreadable) = without_unreadable(&[(&role, dir)], |aside| {
                let tree = DumpTree::discover(dir)?.without(aside).0;
                let step = step_of(&tree, a.step)?;
                check_tree_inferred(&tree, step, a.rank, a.micro, &cfg, &given, &tol)
            })?;
            // a cell whose rows the picture cannot place is "cannot judge", not unreadable
            let (unjudged, unreadable): (Vec<_>, Vec<_>) =
                unreadable.into_iter().partition(|u| u.cannot_judge);
            let mut checked = checked;
            // a cell with a file set aside is not failed without that file (a weaver cell
            // without its forward_data has no entropy: its total never adds up): what it
            // finds there is "cannot judge", the file named unreadable
            for v in &mut checked.verdicts {
                let gone = unreadable
                    .iter()
                    .find(|u| u.rank == Some(v.rank) && u.micro.is_none_or(|m| m == v.micro));
                if let (Some(u), crate::judge::Status::Inconsistent) = (gone, v.status) {
                    v.status = crate::judge::Status::CannotJudge;
                    v.differs.clear();
                    v.notes.push(format!(
                        "cannot judge: {} could not be read, and the cell's loss needs it",
                        u.path.display()
                    ));
                }
            }
            if !unjudged.is_empty() {
                let tree = DumpTree::discover(dir)?;
                let step = step_of(&tree, a.step)?;
                checked.verdicts.extend(
                    unjudged
                        .iter()
                        .filter_map(|u| Some((u.rank?, u.micro?, &u.reason)))
                        .filter(|(r, m, _)| {
                            a.rank.is_none_or(|x| x == *r) && a.micro.is_none_or(|x| x == *m)
                        })
                        .map(|(r, m, why)| {
                            crate::judge::cannot_judge_verdict(&tree, step, (r, m), why)
                        }),
                );
                checked.verdicts.sort_by_key(|v| (v.rank, v.micro));
            }
            let mut report = TreeReport::of_check(checked);
            // a cell whose loss file was set aside is unreadable, not "without a loss file"
            report.skipped.retain(|k| {
                !unreadable.iter().any(|u| {
                    matches!((u.rank, u.micro), (Some(r), Some(m)) if *k == format!("rank {r} micro {m}"))
                })
            });
            report.unreadable = unreadable;
            Report::Tree(report)
        }
        (None, Some(file)) => {
            let file = cli::stdin_path(file);
            let value = crate::formats::read_any(&file)?;
            let inputs = inputs_from_value(&value, &file, &cfg)?;
            Report::Inputs(InputsReport::compute(&inputs, &cfg, &file)?)
        }
        _ => {
            return Err(Error::Usage(format!(
                "give exactly one of --dump-dir DIR or --inputs FILE (presets: {})",
                PRESETS.join(", ")
            )))
        }
    };
    if let Some(out) = &a.output {
        let json = render::losscheck::json::JsonRenderer.render(&report)?;
        std::fs::write(out, json).map_err(|e| Error::io(out, e))?;
    }
    let style = Style {
        color: a.common.color.enabled(),
        width: cli::terminal_width(),
    };
    let text = render::by_name::<Report>(a.format, style).render(&report)?;
    // An inconsistent loss is an error-level finding; a total that cannot be judged for
    // want of its coefficients a warning.
    let found = (report.inconsistent() && a.fail_on <= FailOn::Error)
        || (report.undetermined() && a.fail_on <= FailOn::Warning);
    let unreadable = match &report {
        Report::Tree(t) => t.unreadable.as_slice(),
        Report::Inputs(_) => &[],
    };
    if stderr_notes {
        for u in unreadable {
            eprintln!(
                "losscheck: {} (set aside; every other cell judged)",
                u.reason
            );
        }
    }
    let unreadable = !unreadable.is_empty();
    let code = if unreadable {
        crate::exit_codes::EXIT_BAD_INPUT
    } else if found {
        EXIT_FOUND
    } else {
        EXIT_CLEAN
    };
    Ok((text, code))
}

/// `losscheck DUMP` on another stack's dump (verl, slime / Miles, NeMo-RL, or any
/// producer with --preset): read the step through its producer
/// ([`crate::producers::step_reader_for`]) and recompute its loss
/// ([`crate::losscheck::stacks`]). `None` for a NexRL tree (checked by the tree path).
fn stack_run(a: &Args) -> Result<Option<(String, u8)>, Error> {
    use crate::losscheck::stacks::{check_stack, defaults_for};
    let Some(path) = &a.dump else {
        if a.logs.is_some() || a.mapping.is_some() {
            return Err(Error::Usage(
                "--logs and --mapping go with a DUMP of another stack (losscheck DUMP --step N --logs FILE)"
                    .into(),
            ));
        }
        return Ok(None);
    };
    if a.dump_dir.is_some() || a.inputs.is_some() {
        return Err(Error::Usage(
            "give one of DUMP, --dump-dir DIR or --inputs FILE".into(),
        ));
    }
    let mapping = a
        .mapping
        .as_deref()
        .map(crate::producers::mapping::Mapping::load)
        .transpose()?;
    let reader: &dyn crate::producers::StepReader = match &mapping {
        Some(m) => m,
        None => crate::producers::step_reader_for(path)?,
    };
    if reader.name().starts_with("nexrl") {
        return Ok(None);
    }
    let name = mapping
        .as_ref()
        .map_or(reader.name(), |m| m.producer.as_str());
    let mut defaults = match defaults_for(reader.name()) {
        Some(d) => d,
        None if a.preset.is_some() => {
            defaults_for("verl").ok_or_else(|| Error::internal("verl defaults"))?
        }
        None => {
            let why = if mapping.is_some() {
                "is a mapped layout, with no documented loss defaults"
            } else {
                "writes no trainer loss of its own"
            };
            return Err(Error::Usage(format!(
                "{}: {name} {why}; give --preset to recompute one (presets: {})",
                path.display(),
                PRESETS.join(", ")
            )));
        }
    };
    if let Some(p) = &a.preset {
        defaults.cfg = preset(p).map_err(|e| Error::Usage(format!("--preset: {e}")))?;
        defaults.source = "--preset";
    }
    let given = overrides(a);
    if given.any() {
        defaults.cfg = apply(defaults.cfg, &given)?;
        defaults.source = if a.preset.is_some() {
            "--preset and flags"
        } else {
            "the stack's defaults and flags"
        };
    }
    let steps = reader.steps(path)?;
    let step = match (a.step, steps.as_slice()) {
        (Some(s), _) => s,
        (None, [one]) => *one,
        (None, _) => {
            return Err(Error::Usage(format!(
                "{}: holds steps {:?}; pick one with --step N",
                path.display(),
                steps
            )))
        }
    };
    let dump = reader.read_step(path, step)?;
    let report = check_stack(&dump, &defaults, a.logs.as_deref(), a.atol, a.rtol)?;
    let json = serde_json::to_string_pretty(&report).map_err(Error::internal)?;
    if let Some(out) = &a.output {
        std::fs::write(out, &json).map_err(|e| Error::io(out, e))?;
    }
    let text = match a.format {
        Format::Json => json + "\n",
        _ => report.render_text(),
    };
    let code = if report.inconsistent() && a.fail_on <= FailOn::Error {
        EXIT_FOUND
    } else {
        EXIT_CLEAN
    };
    Ok(Some((text, code)))
}

/// Parse `args` (the program name first) and run `losscheck`, returning stdout's text and the
/// exit code instead of printing them: the door of the Python bindings, which run the
/// command with `--format json` and raise the error this returns (the binary prints it and
/// exits 2). A usage error (clap's, `--help` included) is [`Error::Usage`] with clap's text.
pub fn run_args<I, T>(args: I) -> Result<(String, u8), Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args = <Args as clap::Parser>::try_parse_from(args)
        .map_err(|e| Error::Usage(e.render().to_string().trim_end().to_string()))?;
    run(&args, false)
}

/// Run `losscheck` on `args` (the first item is the program name) and return its exit code;
/// output, `--help`/`--version` and usage errors as the binary gives them.
pub fn run_cli<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Args = match cli::parse_from(args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match run(&args, true) {
        Ok((text, code)) => cli::finish("losscheck", &text, args.common.quiet, code),
        Err(err) => cli::fail("losscheck", &err),
    }
}
