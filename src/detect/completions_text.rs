//! Completions forensics: what the generated text itself shows (read by
//! `readers::completions`): blank completions (EOS first), garbage (non-printable,
//! replacement or mixed-script characters), chat-template tokens leaking into the text,
//! repetition loops, one completion for every prompt, and completions that never end.
//! Each finding quotes one or two completions and names the likely cause first (chat
//! template / EOS token / generation config / reward function).
//!
//! | detector | fires when | severity |
//! |---|---|---|
//! | completions-blank | ≥ 25 % of completions empty or whitespace | warning, error ≥ 50 % |
//! | completions-garbled | ≥ 20 % garbled: ≥ 10 % of characters control / U+FFFD / private use, or ≥ 20 % of words mixing scripts | warning, error ≥ 50 % |
//! | completions-template-leak | ≥ 5 % (and ≥ 2) hold template tokens or a role header | warning, error ≥ 50 % |
//! | completions-repetition | ≥ 20 % end in a unit repeated ≥ 3 times covering half the text | warning, error ≥ 50 % |
//! | completions-identical | one non-empty text is ≥ 50 % of ≥ 4 completions, for ≥ 3 prompts | warning, error ≥ 90 % |
//! | completions-unterminated | the metrics say ≥ 50 % hit the length cap; the cause is read from the text | error |
//!
//! `completions-eos-mismatch` and `completions-prompt-templated-twice` (and the quoting) are in
//! [`super::completions_eos`].

use super::{Finding, Severity};
use crate::frames::log::frame::LogFrame;
use crate::logs::completions::{Completion, CompletionFile};

pub use super::completions_eos::quote;
use super::completions_eos::END_TOKENS;

/// Share of blank completions that is reported (and that makes it an error).
const BLANK_SHARE: (f64, f64) = (0.25, 0.5);
/// Share of garbled completions reported / error.
const GARBLED_SHARE: (f64, f64) = (0.2, 0.5);
/// A completion is garbled when this share of its characters is bad.
const BAD_CHAR_SHARE: f64 = 0.1;
/// ... or this share of its words mixes scripts (at least 2 such words).
const MIXED_WORD_SHARE: f64 = 0.2;
/// Share of completions with template tokens reported (at least 2) / error.
const LEAK_SHARE: (f64, f64) = (0.05, 0.5);
/// Share of looping completions reported / error.
const LOOP_SHARE: (f64, f64) = (0.2, 0.5);
/// Share of completions one text must reach to be "the same for every prompt" / error.
const SAME_SHARE: (f64, f64) = (0.5, 0.9);
/// Mean truncation ratio at or above which completions "never end".
const CAPPED_SHARE: f64 = 0.5;

/// Chat-template markers that must never appear in decoded completion text.
const TEMPLATE_TOKENS: [&str; 14] = [
    "<|im_start|>",
    "<|im_end|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "[INST]",
    "[/INST]",
    "<|assistant|>",
    "<|user|>",
];

/// Script of a letter (coarse Unicode blocks; Kana and Han count as one, Japanese).
fn script(c: char) -> Option<u8> {
    let u = c as u32;
    Some(match u {
        0x41..=0x5a | 0x61..=0x7a | 0xc0..=0x24f => 0,
        0x370..=0x3ff => 1,
        0x400..=0x4ff => 2,
        0x590..=0x5ff => 3,
        0x600..=0x6ff => 4,
        0x900..=0x97f => 5,
        0xe00..=0xe7f => 6,
        0x1100..=0x11ff | 0xac00..=0xd7af => 7,
        0x3040..=0x30ff | 0x3400..=0x4dbf | 0x4e00..=0x9fff => 8,
        _ => return None,
    })
}

/// True for characters no language model should print: control characters other than
/// newline/tab/CR, U+FFFD (bytes that were not UTF-8), private-use code points.
fn is_bad_char(c: char) -> bool {
    (c.is_control() && !matches!(c, '\n' | '\t' | '\r'))
        || c == '\u{fffd}'
        || ('\u{e000}'..='\u{f8ff}').contains(&c)
}

/// True when the text looks like no language: many bad characters or words mixing
/// scripts (`kоt` with a Cyrillic `о`).
pub fn is_garbled(s: &str) -> bool {
    let total = s.chars().filter(|c| !c.is_whitespace()).count();
    if total == 0 {
        return false;
    }
    let bad = s.chars().filter(|c| is_bad_char(*c)).count();
    if bad as f64 >= BAD_CHAR_SHARE * total as f64 {
        return true;
    }
    let (mut words, mut mixed) = (0usize, 0usize);
    for w in s
        .split(|c: char| !c.is_alphabetic())
        .filter(|w| !w.is_empty())
    {
        words += 1;
        let mut seen: Option<u8> = None;
        for c in w.chars() {
            if let Some(sc) = script(c) {
                match seen {
                    Some(x) if x != sc => {
                        mixed += 1;
                        break;
                    }
                    _ => seen = Some(sc),
                }
            }
        }
    }
    mixed >= 2 && mixed as f64 >= MIXED_WORD_SHARE * words as f64
}

/// The first template marker in the text, or a role header line (`assistant` / `user`
/// alone on a line, `\nHuman:`/`\nUser:` turns): the model writing the next turn.
pub fn template_leak(s: &str) -> Option<String> {
    // An end-of-turn token closing the text is the stop token itself (AReaL and verl
    // decode without skip_special_tokens): not a leak.
    let mut s = s.trim_end();
    while let Some(t) = END_TOKENS.iter().find(|t| s.ends_with(*t)) {
        s = s[..s.len() - t.len()].trim_end();
    }
    // The marker that comes first in the text.
    if let Some((_, t)) = TEMPLATE_TOKENS
        .iter()
        .filter_map(|t| s.find(t).map(|p| (p, t)))
        .min()
    {
        return Some(t.to_string());
    }
    for l in s.lines().skip(1) {
        let t = l.trim();
        if ["user", "assistant", "system"].contains(&t) {
            return Some(format!("a line \"{t}\""));
        }
        for p in ["Human:", "User:", "USER:", "### Human:", "### User:"] {
            if l.starts_with(p) {
                return Some(format!("a turn \"{p}\""));
            }
        }
    }
    None
}

/// A repetition loop at the end of the text: `(unit, repeats)` when a unit of 1–200
/// characters repeats at least 3 times and covers at least half of the text (20
/// characters or more). Only the last 4000 characters are looked at.
pub fn repetition(s: &str) -> Option<(String, usize)> {
    let all: Vec<char> = s.chars().collect();
    let c = &all[all.len().saturating_sub(4000)..];
    let n = c.len();
    if n < 20 {
        return None;
    }
    for p in 1..=(n / 3).min(200) {
        let mut run = 0;
        while run + p < n && c[n - 1 - run] == c[n - 1 - run - p] {
            run += 1;
        }
        let covered = run + p;
        if covered >= 3 * p && covered * 2 >= n && covered >= 20 {
            let unit: String = c[n - p..].iter().collect();
            if unit.trim().is_empty() && p == 1 {
                continue;
            }
            return Some((unit, covered / p));
        }
    }
    None
}

/// Steps of a set of completions, sorted and deduplicated.
fn steps_of<'a>(items: impl Iterator<Item = &'a Completion>) -> Vec<i64> {
    let mut s: Vec<i64> = items.filter_map(|c| c.step).collect();
    s.sort_unstable();
    s.dedup();
    s
}

fn severity(share: f64, error_at: f64) -> Severity {
    if share >= error_at {
        Severity::Error
    } else {
        Severity::Warning
    }
}

/// Mean of a frame metric's finite values.
fn frame_mean(frame: Option<&LogFrame>, name: &str) -> Option<f64> {
    let v: Vec<f64> = frame?
        .points(name)
        .map(|(_, v)| v)
        .filter(|v| v.is_finite())
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Up to two quoted examples from `hits`, with their step.
fn examples(hits: &[&Completion]) -> Vec<String> {
    hits.iter()
        .take(2)
        .map(|c| match c.step {
            Some(s) => format!("step {s}: {}", quote(&c.text)),
            None => quote(&c.text),
        })
        .collect()
}

/// Every completions detector over the completions of `files`; `frame` (the metrics of
/// the same scan, when any) tells the length cap and the mean length.
pub fn detect(files: &[CompletionFile], frame: Option<&LogFrame>) -> Vec<Finding> {
    let all: Vec<&Completion> = files.iter().flat_map(|f| f.items.iter()).collect();
    if all.is_empty() {
        return Vec::new();
    }
    let n = all.len() as f64;
    let mut out = Vec::new();
    let mean_len = frame_mean(frame, "completion_len_mean");
    let capped = frame_mean(frame, "truncation_ratio");

    let blank: Vec<&Completion> = all
        .iter()
        .copied()
        .filter(|c| c.text.trim().is_empty())
        .collect();
    let garbled: Vec<&Completion> = all
        .iter()
        .copied()
        .filter(|c| is_garbled(&c.text))
        .collect();
    let loops: Vec<(&Completion, (String, usize))> = all
        .iter()
        .filter_map(|c| repetition(&c.text).map(|r| (*c, r)))
        .collect();
    let leaks: Vec<(&Completion, String)> = all
        .iter()
        .filter_map(|c| template_leak(&c.text).map(|t| (*c, t)))
        .collect();

    let share = blank.len() as f64 / n;
    if share >= BLANK_SHARE.0 {
        let eos_first = mean_len.is_some_and(|m| m <= 1.0);
        let rewarded = blank
            .iter()
            .filter(|c| c.reward.is_some_and(|r| r > 0.0))
            .count();
        let mut e = format!(
            "{} of {} completions ({:.0}%) are empty",
            blank.len(),
            all.len(),
            share * 100.0
        );
        if let Some(m) = mean_len {
            e.push_str(&format!(
                "; the metrics' mean completion length is {m:.3} token(s)"
            ));
        }
        if eos_first {
            e.push_str(": EOS is the first token generated");
        }
        let prompt = blank
            .iter()
            .find_map(|c| c.prompt.as_deref())
            .map(quote)
            .unwrap_or_default();
        let mut causes = vec![
            "chat template: the generation prompt is missing or the prompt is templated twice, so the model's likeliest next token is end-of-turn (EOS first)",
            "EOS token: the sampler's eos/stop id (or pad = eos) is a token the model emits at once; check tokenizer.eos_token_id against generation_config.eos_token_id",
            "generation config: stop strings matching at position 0, max_new_tokens 0/1, every token but EOS suppressed",
        ];
        if rewarded > 0 {
            causes.push("reward function: it gives a positive reward to empty answers");
        }
        let mut f = Finding::new(
            "completions-blank",
            severity(share, BLANK_SHARE.1),
            steps_of(blank.iter().copied()),
            e,
            &causes,
        )
        .num("blank_share", share)
        .with("blank", blank.len())
        .with("completions", all.len())
        .with("blank_with_positive_reward", rewarded)
        .with("examples", examples(&blank))
        .with(
            "likely_cause",
            if eos_first {
                "EOS first: chat template / EOS token"
            } else {
                "chat template / EOS token"
            },
        );
        if !prompt.is_empty() {
            f = f.with("example_prompt_of_a_blank", prompt);
        }
        out.push(f);
    }

    let share = garbled.len() as f64 / n;
    if share >= GARBLED_SHARE.0 {
        let mut e = format!(
            "{} of {} completions ({:.0}%) are not language: control, replacement (U+FFFD) or mixed-script characters",
            garbled.len(),
            all.len(),
            share * 100.0
        );
        if let Some(c) = capped.filter(|c| *c >= CAPPED_SHARE) {
            e.push_str(&format!(
                ", and {:.0}% of completions run to the length cap: high-entropy sampling that never ends",
                c * 100.0
            ));
        }
        out.push(
            Finding::new(
                "completions-garbled",
                severity(share, GARBLED_SHARE.1),
                steps_of(garbled.iter().copied()),
                e,
                &[
                    "the sampler's weights are not a trained model: random init, a checkpoint or LoRA adapter that did not load/sync into the generation engine, a dtype overflow",
                    "tokenizer does not match the model (another model's vocabulary decodes ids to the wrong bytes)",
                    "generation config: temperature far above 1, or a logits processor that flattens the distribution",
                ],
            )
            .num("garbled_share", share)
            .with("garbled", garbled.len())
            .with("completions", all.len())
            .with("examples", examples(&garbled))
            .with("likely_cause", "weights / tokenizer (generation config if temperature is high)"),
        );
    }

    let share = leaks.len() as f64 / n;
    if leaks.len() >= 2 && share >= LEAK_SHARE.0 {
        let hits: Vec<&Completion> = leaks.iter().map(|(c, _)| *c).collect();
        let mut markers: Vec<&str> = leaks.iter().map(|(_, t)| t.as_str()).collect();
        markers.sort_unstable();
        markers.dedup();
        // A turn header after the answer: the model wrote the next turn because the
        // sampler did not stop at its end-of-turn token.
        let next_turn = leaks.iter().any(|(c, _)| {
            ["<|start_header_id|>", "<|im_start|>", "<start_of_turn>"]
                .iter()
                .any(|t| c.text.trim_start().find(t).is_some_and(|p| p > 0))
        });
        // A role line after the answer with the template's tokens gone: the same next turn,
        // decoded with skip_special_tokens (verl's rollout dump, `_log_rollout_data`).
        let role_turn = !next_turn
            && leaks
                .iter()
                .all(|(_, t)| t.starts_with("a line") || t.starts_with("a turn"));
        let causes: &[&str] = if role_turn {
            &[
                "EOS token: the model ends its answer with its end-of-turn token but the sampler does not stop there, so it writes the next turn (the dump decodes with skip_special_tokens, so only the role names show)",
                "chat template: a base model given an instruct template, or the generation prompt missing",
                "reward function: it never penalises text after the answer",
            ]
        } else if next_turn {
            &[
                "EOS token: the model ends its turn with <|eot_id|>/<|im_end|> but the sampler stops only at <|end_of_text|>/<|endoftext|>, so it writes the next turn",
                "chat template: template tokens not registered as special tokens, so skip_special_tokens keeps them",
                "reward function: it never penalises text after the answer",
            ]
        } else {
            &[
                "chat template: the prompt is templated twice (apply_chat_template on already templated text) or a base model is given an instruct template",
                "tokenizer: template tokens not registered as special tokens, so skip_special_tokens keeps them",
                "EOS token: the sampler does not stop at the end-of-turn token",
            ]
        };
        out.push(
            Finding::new(
                "completions-template-leak",
                severity(share, LEAK_SHARE.1),
                steps_of(hits.iter().copied()),
                format!(
                    "{} of {} completions ({:.0}%) contain chat-template text ({})",
                    leaks.len(),
                    all.len(),
                    share * 100.0,
                    markers.join(", ")
                ),
                causes,
            )
            .num("leak_share", share)
            .with("markers", markers)
            .with("examples", examples(&hits))
            .with(
                "likely_cause",
                if next_turn || role_turn {
                    "EOS token"
                } else {
                    "chat template"
                },
            ),
        );
    }

    let share = loops.len() as f64 / n;
    if share >= LOOP_SHARE.0 {
        let hits: Vec<&Completion> = loops.iter().map(|(c, _)| *c).collect();
        let (unit, reps) = &loops[0].1;
        out.push(
            Finding::new(
                "completions-repetition",
                severity(share, LOOP_SHARE.1),
                steps_of(hits.iter().copied()),
                format!(
                    "{} of {} completions ({:.0}%) end in a repetition loop (e.g. {} repeated {reps} times)",
                    loops.len(),
                    all.len(),
                    share * 100.0,
                    quote(unit)
                ),
                &[
                    "generation config: greedy or low-temperature sampling without a repetition penalty",
                    "EOS token: the model cannot emit the sampler's stop token, so it loops until the length cap",
                    "reward function: a length or keyword reward the loop farms",
                ],
            )
            .num("loop_share", share)
            .with("examples", examples(&hits))
            .with("likely_cause", "generation config"),
        );
    }

    if let Some(f) = identical(&all) {
        out.push(f);
    }
    // Text running on past the template's end token to the cap names the EOS token; the
    // template leak it makes (a next turn) is that finding, not a second one.
    let eos_mismatch = super::completions_eos::eos_mismatch(&all, capped);
    let eos_fired = eos_mismatch.is_some();
    if let Some(f) = eos_mismatch {
        out.retain(|x| {
            !(x.detector == "completions-template-leak"
                && x.evidence.get("likely_cause").and_then(|v| v.as_str()) == Some("EOS token"))
        });
        out.push(f);
    }
    out.extend(super::completions_eos::prompt_templated_twice(&all));

    if let Some(c) = capped.filter(|c| *c >= CAPPED_SHARE) {
        let (cause, why) = if garbled.len() as f64 / n >= GARBLED_SHARE.0 {
            (
                "weights / tokenizer",
                "the text is garbage: high-entropy sampling never picks EOS",
            )
        } else if loops.len() as f64 / n >= LOOP_SHARE.0 {
            (
                "generation config",
                "the text loops: the model repeats itself until the cap",
            )
        } else if eos_fired {
            (
                "EOS token mismatch",
                "the text runs on past the chat template's end token (completions-eos-mismatch)",
            )
        } else if leaks.len() >= 2 {
            (
                "EOS token",
                "the text runs past its end-of-turn into template tokens",
            )
        } else {
            (
                "max completion length",
                "the text reads as normal language: the cap is too small for the task",
            )
        };
        out.push(
            Finding::new(
                "completions-unterminated",
                Severity::Error,
                steps_of(all.iter().copied()),
                format!(
                    "{:.0}% of completions hit the length cap (metrics) and {why}",
                    c * 100.0
                ),
                &[match cause {
                    "weights / tokenizer" => "the sampler's weights or tokenizer are wrong (see completions-garbled), not max_completion_length",
                    "generation config" => "generation config: no repetition penalty / low temperature",
                    "EOS token" => "EOS token: the sampler does not stop at the end-of-turn token",
                    "EOS token mismatch" => "EOS token mismatch: generation_config.eos_token_id is not the chat template's end token (see completions-eos-mismatch)",
                    _ => "max completion length too small for the task",
                }],
            )
            .num("mean_truncation_ratio", c)
            .with("likely_cause", cause)
            .with("examples", examples(&all)),
        );
    }
    out
}

/// Make the metric findings' causes agree with what the completions showed: the cause
/// read from the text goes first in the truncation finding (a garbled or looping text is
/// not "max length too small"), and blank or identical completions go first among the
/// causes of dead groups and zero loss (every completion scores the same).
pub fn reconcile(findings: &mut [Finding]) {
    let cause_of = |name: &str| {
        findings
            .iter()
            .find(|f| f.detector == name)
            .and_then(|f| f.evidence.get("likely_cause"))
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let unterminated =
        cause_of("completions-unterminated").filter(|c| c != "max completion length");
    let twice = findings
        .iter()
        .any(|f| f.detector == "completions-prompt-templated-twice");
    let same = if findings.iter().any(|f| f.detector == "completions-blank") {
        Some("blank completions (completions-blank) all score the same: no reward variance in any group")
    } else if findings
        .iter()
        .any(|f| f.detector == "completions-identical")
    {
        Some("one completion for every prompt (completions-identical): no reward variance in a group")
    } else {
        None
    };
    for f in findings.iter_mut() {
        let first = match f.detector.as_str() {
            "truncation" => unterminated
                .as_ref()
                .map(|c| format!("the completions show why they hit the cap: {c} (completions-unterminated), not the length limit")),
            "dead-groups" | "zero-loss" | "zero-grad" => same.map(str::to_string),
            "completions-blank" | "completions-identical" | "completions-garbled" if twice => {
                Some("the prompt is templated twice (completions-prompt-templated-twice): the model answers a malformed conversation".to_string())
            }
            _ => None,
        };
        if let Some(c) = first {
            f.likely_causes.insert(0, c);
        }
    }
}

/// One non-empty completion for most prompts (policy collapse or a prompt that never
/// reaches the model).
fn identical(all: &[&Completion]) -> Option<Finding> {
    let mut counts: std::collections::HashMap<&str, (usize, Vec<&str>)> =
        std::collections::HashMap::new();
    for c in all.iter().filter(|c| !c.text.trim().is_empty()) {
        let e = counts.entry(c.text.as_str()).or_insert((0, Vec::new()));
        e.0 += 1;
        if let Some(p) = c.prompt.as_deref() {
            if !e.1.contains(&p) {
                e.1.push(p);
            }
        }
    }
    let (text, (count, prompts)) = counts
        .into_iter()
        .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0.cmp(a.0)))?;
    let share = count as f64 / all.len() as f64;
    let known_prompts = all.iter().any(|c| c.prompt.is_some());
    if count < 4 || share < SAME_SHARE.0 || (known_prompts && prompts.len() < 3) {
        return None;
    }
    let steps = steps_of(all.iter().copied().filter(|c| c.text == text));
    let rewards: Vec<f64> = all
        .iter()
        .filter(|c| c.text == text)
        .filter_map(|c| c.reward)
        .collect();
    let mut f = Finding::new(
        "completions-identical",
        severity(share, SAME_SHARE.1),
        steps,
        format!(
            "the same completion {} is {count} of {} completions ({:.0}%), for {} different prompts",
            quote(text),
            all.len(),
            share * 100.0,
            prompts.len()
        ),
        &[
            "reward function: it rewards this one answer whatever the prompt (reward hacking; the policy collapsed onto it)",
            "chat template / context truncation: the prompt never reaches the model (empty or cut to the template), so every prompt looks the same",
            "generation config: greedy decoding (do_sample false / temperature 0) makes every group identical",
        ],
    )
    .num("share", share)
    .with("distinct_prompts", prompts.len())
    .with("likely_cause", "reward function / prompt not reaching the model");
    if let Some(r) = rewards.first() {
        f = f.num("reward_of_first", *r);
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_are_found_at_the_end_only_when_they_cover_half() {
        let (u, r) =
            repetition("The answer is 4. I think I think I think I think I think I think").unwrap();
        assert_eq!((u.as_str(), r), (" I think", 6));
        assert_eq!(
            repetition("The answer is 42, because six times seven is 42."),
            None
        );
        assert_eq!(repetition("aaaa"), None);
    }

    #[test]
    fn garbage_and_template_tokens() {
        assert!(is_garbled("Z@\u{fffd}-\u{fffd}'\u{fffd}\u{fffd}\u{1e}J"));
        assert!(!is_garbled("Paris is the capital of France."));
        // Two words with a Cyrillic letter among Latin ones.
        assert!(is_garbled("the cаt sаt on the mat"));
        assert_eq!(
            template_leak("4<|eot_id|><|start_header_id|>user").as_deref(),
            Some("<|eot_id|>")
        );
        assert_eq!(
            template_leak("4\nuser\nand more").as_deref(),
            Some("a line \"user\"")
        );
        assert_eq!(template_leak("The user asked for 4."), None);
        assert_eq!(template_leak("4.<|im_end|>"), None);
        assert_eq!(
            template_leak("4.<|im_end|>\n<|im_start|>user").as_deref(),
            Some("<|im_end|>")
        );
    }

    #[test]
    fn quotes_escape_and_cut() {
        assert_eq!(quote("a\u{13}\n\"b"), "\"a\\u{13}\\n\\\"b\"");
        assert_eq!(quote(&"x".repeat(70)).chars().count(), 60 + 3);
    }
}
