//! The replay recipe: the run's own command line (`run_metadata.json`'s `argv`) with
//! `--iters` cut to the crashing step and the seed pinned, plus the same command with the
//! signature's usual fix applied.

use super::{CrashSummary, Replay, RunInfo};

/// Quote one argument for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Set `--flag value` in `args` (replace the value when present, else append).
fn set_flag(args: &mut Vec<String>, flag: &str, value: &str) {
    let joined = format!("{flag}=");
    if let Some(i) = args.iter().position(|a| a.starts_with(&joined)) {
        args[i] = format!("{flag}={value}");
        return;
    }
    if let Some(i) = args.iter().position(|a| a == flag) {
        if i + 1 < args.len() {
            args[i + 1] = value.to_string();
            return;
        }
        args.truncate(i);
    }
    args.push(flag.to_string());
    args.push(value.to_string());
}

fn remove_flag(args: &mut Vec<String>, flag: &str) {
    args.retain(|a| a != flag);
}

fn get_flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let joined = format!("{flag}=");
    if let Some(v) = args.iter().find_map(|a| a.strip_prefix(joined.as_str())) {
        return Some(v);
    }
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

fn command(argv: &[String]) -> String {
    let mut parts = vec!["python3".to_string()];
    parts.extend(argv.iter().map(|a| shell_quote(a)));
    parts.join(" ")
}

/// What `batch_indices` says about the completions: one prompt index per completion when
/// it has as many entries as `token_counts`, else only the prompts it names (the trainer
/// wrote fewer indices than completions, so no completion can be tied to its prompt).
fn batch_indices_note(batch_indices: &[i64], token_counts: &[i64]) -> String {
    let prompts: std::collections::BTreeSet<i64> = batch_indices.iter().copied().collect();
    if token_counts.is_empty() || batch_indices.len() == token_counts.len() {
        format!(
            "batch_indices {:?} map each of the {} completions to its prompt ({} distinct); the prompts are listed under the offending batch.",
            batch_indices,
            batch_indices.len(),
            prompts.len()
        )
    } else {
        format!(
            "batch_indices {:?} has {} entries but token_counts has {} completions: it names prompts {:?} of the batch, and which completion came from which prompt is not recorded.",
            batch_indices,
            batch_indices.len(),
            token_counts.len(),
            prompts
        )
    }
}

/// The recipe, or `None` when `run_metadata.json` gave no command line.
pub fn recipe(run: &RunInfo, crash: Option<&CrashSummary>) -> Option<Replay> {
    if run.argv.is_empty() {
        return None;
    }
    let mut args = run.argv.clone();
    let mut notes = Vec::new();
    // The seed the command line gives wins over the config's (the command is what runs).
    let seed = match get_flag(&args, "--seed") {
        Some(s) => s.to_string(),
        None => {
            let s = run.config.get("seed").and_then(|v| v.as_i64()).unwrap_or(0);
            set_flag(&mut args, "--seed", &s.to_string());
            s.to_string()
        }
    };
    let step = crash.and_then(|c| c.step);
    if let Some(s) = step {
        set_flag(&mut args, "--iters", &s.to_string());
        notes.push(format!(
            "Runs the same arguments with seed {seed} and stops at step {s}: the batch iterator draws the same batches, so step {s} sees the offending batch again (sampling is stochastic; the completions may differ)."
        ));
    } else {
        notes.push(format!("Reruns the run with seed {seed} pinned."));
    }
    if let Some(ctx) = crash.and_then(|c| c.context.as_ref()) {
        if !ctx.batch_indices.is_empty() {
            notes.push(batch_indices_note(&ctx.batch_indices, &ctx.token_counts));
        }
        if !ctx.empty_indices.is_empty() {
            notes.push(format!(
                "Completions {:?} had no token (token_counts {:?}).",
                ctx.empty_indices, ctx.token_counts
            ));
        }
    }
    notes.push("Add --debug-disable-eval to skip validation passes while bisecting.".to_string());
    let fix_command = crash.and_then(|c| {
        let mut f = args.clone();
        match c.classification.id {
            "empty-array" => {
                remove_flag(&mut f, "--debug-no-sequence-fallback");
                set_flag(&mut f, "--importance-sampling-level", "sequence");
                set_flag(&mut f, "--debug-min-new-tokens", "2");
            }
            "nan-gradient" => {
                let lr = get_flag(&f, "--learning-rate")
                    .and_then(|v| v.parse::<f64>().ok())
                    .or_else(|| run.config.get("learning_rate").and_then(|v| v.as_f64()))
                    .unwrap_or(1e-5);
                set_flag(&mut f, "--learning-rate", &crate::fmt::arg(lr / 10.0));
            }
            "oom" => {
                let bs = run
                    .config
                    .get("batch_size")
                    .and_then(|v| v.as_i64())
                    .unwrap_or(2);
                set_flag(&mut f, "--batch-size", &(bs / 2).max(1).to_string());
                if !f.iter().any(|a| a == "--grad-checkpoint") {
                    f.push("--grad-checkpoint".to_string());
                }
            }
            _ => return None,
        }
        Some(command(&f))
    });
    Some(Replay {
        command: command(&args),
        fix_command,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_flags() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote("--iters"), "--iters");
        let mut a = vec!["x.py".to_string(), "--iters".to_string(), "200".to_string()];
        set_flag(&mut a, "--iters", "23");
        set_flag(&mut a, "--seed", "0");
        assert_eq!(a, ["x.py", "--iters", "23", "--seed", "0"]);
    }

    #[test]
    fn batch_indices_shorter_than_the_completions_are_not_mapped_one_to_one() {
        let n = batch_indices_note(&[0, 0, 1, 1], &[3, 0, 5, 0, 2, 2, 1, 0]);
        assert_eq!(
            n,
            "batch_indices [0, 0, 1, 1] has 4 entries but token_counts has 8 completions: it names prompts {0, 1} of the batch, and which completion came from which prompt is not recorded."
        );
        assert!(!n.contains("each of the"));
        let n = batch_indices_note(&[0, 0, 1, 1], &[0, 14, 0, 9]);
        assert!(n.starts_with("batch_indices [0, 0, 1, 1] map each of the 4 completions to its prompt (2 distinct)"), "{n}");
    }
}
