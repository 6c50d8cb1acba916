//! One-line step reports: nanoGPT `iter N:`/`step N:` lines, mlx-lm-lora `Iter N:`
//! reports, per-micro diagnostics, verl console `step:N - key:value` lines (and their
//! soft-wrapped continuations) and TRL/ms-swift Python dict lines.

use super::{TextItem, EVAL_MARK};
use crate::logs::steps::parse_number_text;
use crate::model::log::SourceKind;

/// nanoGPT's evaluation line `step 3000: train loss 4.0390, val loss 4.0427`: an eval
/// record, not a training step (its keys are `eval/…`, `val_loss` kept as is).
pub(super) fn parse_eval_step(t: &str) -> Option<TextItem> {
    let pos = t.find("step ")?;
    if pos > 0 && t.as_bytes()[pos - 1].is_ascii_alphanumeric() {
        return None;
    }
    let rest = &t[pos + 5..];
    let (num, body) = rest.split_once(':')?;
    let step: i64 = num.trim().parse().ok()?;
    let mut fields = Vec::new();
    for part in split_top(body, ',') {
        parse_named_part(part, "", &mut fields);
    }
    if fields.is_empty() || !fields.iter().any(|(k, _)| k.starts_with("val")) {
        return None;
    }
    for (k, _) in &mut fields {
        if !k.starts_with("val") {
            *k = format!("eval/{k}");
        }
    }
    fields.push((EVAL_MARK.to_string(), 1.0));
    Some(TextItem::Step {
        source: SourceKind::NanoGpt,
        step: Some(step),
        fields,
        tail: None,
    })
}

/// The second half of a soft-wrapped verl console line: ` - `-separated `key:number`
/// pairs with no `step:` (the first key may be cut: `/rewards/min:-1.0 - critic/…`).
pub(super) fn is_verl_continuation(t: &str) -> bool {
    let parts: Vec<&str> = t.split(" - ").collect();
    let pairs = parts
        .iter()
        .filter(|p| {
            p.rsplit_once(':').is_some_and(|(k, v)| {
                !k.trim().is_empty() && !k.contains(' ') && parse_number_text(v).is_some()
            })
        })
        .count();
    parts.len() >= 2 && pairs * 2 >= parts.len()
}

/// Split at `sep` outside (), [], {} and quotes.
pub(super) fn split_top(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match quote {
            Some(q) => {
                if c == q {
                    quote = None;
                }
            }
            None => match c {
                '\'' | '"' => quote = Some(c),
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                _ if c == sep && depth == 0 => {
                    out.push(&s[start..i]);
                    start = i + c.len_utf8();
                }
                _ => {}
            },
        }
    }
    out.push(&s[start..]);
    out
}

/// `name` lowercased with spaces as `_`.
pub(super) fn key_of(words: &[&str]) -> String {
    words.join("_").to_ascii_lowercase()
}

/// A value with an optional unit glued or spaced: `21747.97ms`, `0.412s`, `812 MB`, `12.3%`.
/// Returns the value in canonical units and the key suffix.
pub(super) fn value_with_unit(
    num: &str,
    unit_word: Option<&str>,
) -> Option<(f64, &'static str, bool)> {
    if let Some(v) = parse_number_text(num) {
        let unit = unit_word.unwrap_or("");
        return Some(match unit {
            "ms" => (v / 1000.0, "_s", true),
            "s" | "sec" => (v, "_s", true),
            "MB" | "MiB" => (v / 1024.0, "_gb", true),
            "GB" | "GiB" => (v, "_gb", true),
            _ => (v, "", false),
        });
    }
    let split = num
        .char_indices()
        .rev()
        .find(|(_, c)| c.is_ascii_digit() || *c == '.')
        .map(|(i, _)| i + 1)?;
    let (n, unit) = num.split_at(split);
    let v = parse_number_text(n)?;
    match unit {
        "ms" => Some((v / 1000.0, "_s", true)),
        "s" => Some((v, "_s", true)),
        "MB" => Some((v / 1024.0, "_gb", true)),
        "GB" => Some((v, "_gb", true)),
        "%" => Some((v / 100.0, "_frac", true)),
        _ => None,
    }
}

/// `Name words 1.23[unit] [(sub 1, sub 2)]` → fields.
pub(super) fn parse_named_part(part: &str, prefix: &str, out: &mut Vec<(String, f64)>) {
    let (main, paren) = match part.find('(') {
        Some(i) if part.trim_end().ends_with(')') => {
            let inner = part[i + 1..].trim_end();
            (&part[..i], Some(&inner[..inner.len() - 1]))
        }
        _ => (part, None),
    };
    let words: Vec<&str> = main.split_whitespace().collect();
    // Find the last word that is a number (possibly with a glued unit).
    for idx in (1..words.len()).rev() {
        let unit = words.get(idx + 1).copied();
        if let Some((v, suffix, used)) = value_with_unit(words[idx], unit) {
            let name = key_of(&words[..idx]);
            let key = if used {
                format!("{prefix}{name}{suffix}")
            } else {
                format!("{prefix}{name}")
            };
            out.push((key, v));
            if let Some(inner) = paren {
                for sub in split_top(inner, ',') {
                    parse_named_part(sub, &format!("{prefix}{name}_"), out);
                }
            }
            return;
        }
    }
}

/// `iter N: …` (nanoGPT) and `Iter N: …` (mlx-lm-lora), after any prefix.
pub(super) fn parse_iter(t: &str) -> Option<TextItem> {
    let (pos, source) = match (t.find("Iter "), t.find("iter ")) {
        (Some(i), _) => (i, SourceKind::MlxReport),
        (None, Some(i)) => (i, SourceKind::NanoGpt),
        _ => return None,
    };
    if pos > 0 && t.as_bytes()[pos - 1].is_ascii_alphanumeric() {
        return None;
    }
    let rest = &t[pos + 5..];
    let colon = rest.find(':')?;
    // litgpt's `iter 7 step 1: loss 1.1201, iter time: 1819.72ms` (finetune scripts: the
    // micro-iteration, then the optimizer step): each line is one iteration, its number
    // the step.
    let head = rest[..colon].trim();
    let step: i64 = match head.split_once(" step ") {
        Some((n, m)) if m.trim().parse::<i64>().is_ok() => n.trim().parse().ok()?,
        _ => head.parse().ok()?,
    };
    let mut fields = Vec::new();
    for part in split_top(&rest[colon + 1..], ',') {
        parse_named_part(part, "", &mut fields);
    }
    if fields.is_empty() {
        return None;
    }
    // `Iter 1: Val loss 2.480, Val took 0.732s` is a validation record.
    if fields.iter().all(|(k, _)| k.starts_with("val_")) {
        fields.push((EVAL_MARK.to_string(), 1.0));
    }
    Some(TextItem::Step {
        source,
        step: Some(step),
        fields,
        tail: None,
    })
}

/// `[Micro k] 3. Samples scored: mem=812 MB, time=0.412s, rewards=0.5±0.1` and the
/// unnumbered-micro `5. Optimizer step finished: mem=… MB, time=…s total`.
pub(super) fn parse_micro(t: &str) -> Option<TextItem> {
    let (micro, body) = if let Some(rest) = t.strip_prefix("[Micro") {
        let (n, body) = rest.split_once(']')?;
        (n.trim().parse::<u32>().ok(), body)
    } else if t.contains("Optimizer step finished:") {
        (None, t)
    } else {
        return None;
    };
    let (label, kv) = body.split_once(':')?;
    let label = label.trim();
    let ends_iteration = label.contains("Optimizer step finished");
    let mut stage = None;
    let mut fields = Vec::new();
    for part in split_top(kv, ',') {
        let Some((k, v)) = part.split_once('=') else {
            continue;
        };
        let k = k.trim();
        let v = v.trim();
        if let Some((m, s)) = v.split_once('±') {
            if let (Some(m), Some(s)) = (parse_number_text(m), parse_number_text(s)) {
                fields.push((format!("micro_{k}_mean"), m));
                fields.push((format!("micro_{k}_std"), s));
            }
            continue;
        }
        let mut words = v.split_whitespace();
        let num = words.next().unwrap_or("");
        let unit = words.next();
        if let Some((val, suffix, _)) = value_with_unit(num, unit) {
            if k == "time" && !ends_iteration {
                // The micro's clock at the end of this stage, not a step time.
                stage = Some((stage_name(label), val));
                continue;
            }
            let key = if k == "time" {
                "step_time_s".to_string()
            } else {
                format!("micro_{k}{suffix}")
            };
            fields.push((key, val));
        }
    }
    Some(TextItem::Micro {
        fields,
        micro,
        stage,
        ends_iteration,
    })
}

/// `2. Samples generated` → `samples_generated` (the stage number dropped).
fn stage_name(label: &str) -> String {
    let words: Vec<&str> = label
        .split_whitespace()
        .filter(|w| !w.trim_end_matches('.').chars().all(|c| c.is_ascii_digit()))
        .collect();
    key_of(&words)
}

/// `step:34 - actor/pg_loss:0.0424 - actor/grad_norm:0.1296 - …` after any prefix.
pub(super) fn parse_verl_console(t: &str) -> Option<TextItem> {
    let pos = t.find("step:")?;
    if pos > 0 && t.as_bytes()[pos - 1].is_ascii_alphanumeric() {
        return None;
    }
    let body = t[pos..].trim_end_matches([' ', '-']);
    let mut step = None;
    let mut fields = Vec::new();
    let mut tail = None;
    let parts: Vec<&str> = body.split(" - ").collect();
    for part in &parts {
        let Some((k, v)) = part.rsplit_once(':') else {
            continue;
        };
        let k = k.trim();
        let v = v.trim();
        let v = v
            .strip_prefix("np.float64(")
            .or_else(|| v.strip_prefix("np.float32("))
            .and_then(|x| x.strip_suffix(')'))
            .unwrap_or(v);
        if k == "step" {
            step = v.parse::<i64>().ok();
        } else if let Some(f) = parse_number_text(v) {
            fields.push((k.to_string(), f));
        }
    }
    step?;
    if parts.len() > 1 {
        tail = Some(verl_line_tail(t));
    }
    // verl writes val-only metrics (`val-core/…`, `val-aux/…`) at step 0 before training.
    if !fields.is_empty() && fields.iter().all(|(k, _)| k.starts_with("val")) {
        fields.push((EVAL_MARK.to_string(), 1.0));
    }
    Some(TextItem::Step {
        source: SourceKind::VerlConsole,
        step,
        fields,
        tail,
    })
}

/// The raw text of a verl line's last pair as the terminal cut it (`… - c`, `… -
/// actor/ppo_kl:0.0`), to be joined with the start of the next line; empty when the line
/// ended on its separator (`… - response_length/min:38.0 -`).
pub(super) fn verl_line_tail(t: &str) -> String {
    let t = t.trim_end();
    if t.ends_with('-') {
        return String::new();
    }
    t.rsplit(" - ")
        .next()
        .unwrap_or("")
        .trim_start()
        .to_string()
}

/// Pairs `key:value` of a verl continuation line, its first part joined to `head` (the
/// previous line's last, possibly cut, pair: `c` + `ritic/score/max:0.133`,
/// `actor/ppo_kl:0.0` + `00`), and this line's own tail for the line after it. A line that
/// starts on the separator (`- actor/entropy_loss:0.001 - …`) leaves `head` whole.
pub(super) fn verl_pairs(t: &str, head: &str) -> (Vec<(String, f64)>, String) {
    let tail = verl_line_tail(t);
    // A wrapped line can end on its separator (`… - response_length/min:38.0 -`).
    let body = t.trim().trim_end_matches([' ', '-']);
    let mut parts: Vec<String> = Vec::new();
    let body = match body.strip_prefix("- ") {
        Some(rest) => {
            parts.push(head.to_string());
            rest
        }
        None => body,
    };
    for (i, part) in body.split(" - ").enumerate() {
        if i == 0 && parts.is_empty() {
            parts.push(format!("{head}{part}"));
        } else {
            parts.push(part.to_string());
        }
    }
    let mut out = Vec::new();
    for part in &parts {
        let Some((k, v)) = part.rsplit_once(':') else {
            continue;
        };
        let Some(v) = parse_number_text(v.trim()) else {
            continue;
        };
        let k = k.trim();
        if !k.is_empty() {
            out.push((k.to_string(), v));
        }
    }
    (out, tail)
}

/// Marks a record salvaged from a dict cut mid-line (the assembler removes it).
pub(super) const RECORD_CUT: &str = "__record_cut";
/// Marks a dict whose line ends after a whole pair (`…, 'max_length': 81.0, `): a dict
/// wrapped onto the next lines, whose pairs the assembler joins to it.
pub(super) const RECORD_OPEN: &str = "__record_open";
/// Marks a line of `'key': value` pairs with no opening brace: the rest of an open dict,
/// or on its own an ms-swift record pasted without braces.
pub(super) const RECORD_TAIL: &str = "__record_tail";

/// A Python dict repr line `{'loss': 0.0, 'grad_norm': nan, …}` (TRL/transformers stdout).
pub(super) fn parse_py_dict(t: &str) -> Option<TextItem> {
    let mut cut = false;
    let mut tail = false;
    let mut prefix = "";
    let body = match t.find("{'") {
        Some(start) => {
            prefix = &t[..start];
            // A dict that is an argument's value (`… extra_info={'is_end': True}`) is not
            // a record of metrics.
            if prefix.trim_end().ends_with('=') {
                return None;
            }
            let body = t[start..]
                .strip_suffix('}')
                .or_else(|| {
                    // The last `}` may come before the `{'` (`0}:.{'loss': …`): then there
                    // is no dict.
                    let end = t.rfind('}').filter(|&end| end > start)?;
                    Some(&t[start..end])
                })
                .or_else(|| {
                    // A record cut mid-dict (a paste, a killed process): its whole pairs
                    // are kept, the last (perhaps cut) one dropped.
                    (!t[start..].contains('}')).then(|| {
                        cut = true;
                        &t[start..]
                    })
                })?;
            body.strip_prefix('{')?
        }
        // ms-swift lines pasted without their braces: `'loss': -0.0, 'grad_norm': 0.0, …`.
        None if t.starts_with('\'') && t.contains("': ") && !t.contains('{') => {
            tail = true;
            t.strip_suffix('}').unwrap_or(t)
        }
        None => return None,
    };
    let mut fields = Vec::new();
    let mut step_text = None;
    let mut parts = split_top(body, ',');
    if cut && !body.trim_end().ends_with(',') {
        parts.pop();
    }
    for part in parts {
        let Some((k, v)) = part.split_once(':') else {
            continue;
        };
        let k = k.trim().trim_matches(|c| c == '\'' || c == '"');
        let v = v.trim();
        // ms-swift: `'global_step/max_steps': '5/3766'`.
        if k == "global_step/max_steps" {
            step_text = v
                .trim_matches(|c| c == '\'' || c == '"')
                .split('/')
                .next()
                .and_then(|n| n.trim().parse::<i64>().ok());
            continue;
        }
        let v = v
            .strip_prefix("tensor(")
            .and_then(|x| x.split([',', ')']).next())
            .unwrap_or(v);
        // Today's transformers prints values as strings (`'loss': '-4.967e-09'`, `'nan'`).
        let v = v
            .strip_prefix('\'')
            .and_then(|x| x.strip_suffix('\''))
            .unwrap_or(v);
        let f = match v {
            "True" => Some(1.0),
            "False" => Some(0.0),
            _ => parse_number_text(v),
        };
        if let Some(f) = f {
            fields.push((k.to_string(), f));
        }
    }
    if fields.is_empty() {
        return None;
    }
    let open = (cut || tail) && body.trim_end().ends_with(',');
    if cut && !tail {
        fields.push((RECORD_CUT.to_string(), 1.0));
    }
    if open {
        fields.push((RECORD_OPEN.to_string(), 1.0));
    }
    if tail {
        fields.push((RECORD_TAIL.to_string(), 1.0));
    }
    // TRL/HF write no step (numbered in order); TRL PPO counts `episode`s, LLaMA-Factory
    // `current_steps`, ms-swift `global_step/max_steps`.
    // A `step 12: {…}` / `iteration 5 {…}` prefix (slime's `step N:` / `perf N:`) names it too.
    let step = step_text
        .or_else(|| {
            ["step", "global_step", "current_steps", "episode"]
                .iter()
                .find_map(|name| fields.iter().find(|(k, _)| k == name))
                .map(|(_, v)| *v as i64)
        })
        .or_else(|| super::step_prefix::prefix_step(prefix))
        .or_else(|| super::step_prefix::tqdm_step(prefix));
    if fields.iter().any(|(k, _)| k.starts_with("eval_"))
        && !fields.iter().any(|(k, _)| k == "loss" || k == "grad_norm")
    {
        fields.push((EVAL_MARK.to_string(), 1.0));
    }
    // HF Trainer's closing summary (`train_runtime`, `train_loss` = the mean over the run):
    // kept under `summary/` so its mean loss never stands in for a step's loss.
    if fields.iter().any(|(k, _)| k == "train_runtime") {
        for (k, _) in &mut fields {
            *k = format!("summary/{k}");
        }
    }
    Some(TextItem::Step {
        source: SourceKind::TrlDict,
        step,
        fields,
        tail: None,
    })
}
