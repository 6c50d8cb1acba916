//! Two completions signatures whose cause is the chat template's own tokens:
//!
//! | detector | fires when | severity |
//! |---|---|---|
//! | completions-eos-mismatch | the metrics say ≥ 50 % hit the length cap and ≥ 50 % (≥ 2) of the texts run on past an end-of-turn token | error |
//! | completions-prompt-templated-twice | ≥ 25 % (≥ 2) of the prompts hold the template twice | warning, error ≥ 50 % |
//!
//! The first is what a trainer writes when it stops only at the tokenizer's `eos_token`
//! and the model's `generation_config.eos_token_id` while the chat template ends a turn
//! with another token: TRL 1.16's `GRPOTrainer.__init__` builds its stop ids from exactly
//! those two (`eos_token_ids`), counts a completion as clipped when its last id is none of
//! them (`_generate`: `completions/clipped_ratio`), and decodes with
//! `skip_special_tokens=True`, which keeps an end token added as a plain token
//! (trl/trainer/grpo_trainer.py, huggingface/trl@d2b69d769dab6f77acbfd33252bcd7d22765571b,
//! trl 1.16.0; fixtures/completions/trl_wrong_eos). The second reads the prompt TRL logs
//! as given: for conversational data a list of messages that the trainer passes to
//! `apply_chat_template` (`_tokenize_prompts`), so template tokens inside a message's
//! content were put there by a first templating (fixtures/completions/trl_templated_twice).

use super::{Finding, Severity};
use crate::logs::completions::Completion;

/// Characters of a completion quoted in a finding.
const QUOTE_CHARS: usize = 60;
/// End-of-turn tokens a decoder without `skip_special_tokens` leaves at a completion's end.
pub(crate) const END_TOKENS: [&str; 6] = [
    "<|im_end|>",
    "<|eot_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "</s>",
];

/// A completion quoted for a finding: control characters escaped, cut at
/// 60 characters (`QUOTE_CHARS`).
pub fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for (n, c) in s.chars().enumerate() {
        if n == QUOTE_CHARS {
            out.push('…');
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Share of completions that must run past an end token (at least 2).
const RUN_PAST_SHARE: f64 = 0.5;
/// Mean truncation ratio (metrics) from which completions "run to the cap".
const CAPPED_SHARE: f64 = 0.5;
/// Share of prompts templated twice that is reported (at least 2) / error.
const TWICE_SHARE: (f64, f64) = (0.25, 0.5);

/// Turn-opening tokens and the end-of-turn token of the same template.
const TURN_STARTS: [(&str, &str); 3] = [
    ("<|im_start|>", "<|im_end|>"),
    ("<|start_header_id|>", "<|eot_id|>"),
    ("<start_of_turn>", "<end_of_turn>"),
];

/// Template tokens that only a templating puts into a chat message's content.
const TEMPLATE_OPENERS: [&str; 7] = [
    "<|im_start|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<start_of_turn>",
    "[INST]",
    "<|user|>",
    "<|system|>",
];

/// The end-of-turn token after which the text goes on: an end token followed by more
/// text, or a turn opened after the answer (its template's end token). `None` when the
/// text stops at its first end token (or holds none).
pub fn runs_past_end(s: &str) -> Option<&'static str> {
    let first = END_TOKENS
        .iter()
        .filter_map(|t| s.find(t).map(|p| (p, *t)))
        .min();
    if let Some((p, t)) = first {
        if !s[p + t.len()..].trim().is_empty() {
            return Some(t);
        }
    }
    TURN_STARTS
        .iter()
        .find(|(open, _)| s.find(open).is_some_and(|p| !s[..p].trim().is_empty()))
        .map(|(_, end)| *end)
}

fn count(s: &str, pat: &str) -> usize {
    s.matches(pat).count()
}

/// A turn opened by `open` (e.g. `<|im_start|>user`) holding another turn or a BOS
/// before its end token `end`.
fn nested(s: &str, open: &str, inner: &[&str], end: &str) -> bool {
    s.match_indices(open).any(|(p, _)| {
        let rest = &s[p + open.len()..];
        let stop = rest.find(end).unwrap_or(rest.len());
        inner.iter().any(|i| rest[..stop].contains(i))
    })
}

/// What shows that a prompt is templated twice, or `None`. `chat`: the prompt was logged
/// as messages, which the trainer templates: any template token in their text.
pub fn templated_twice(prompt: &str, chat: bool) -> Option<String> {
    if chat {
        if let Some(t) = TEMPLATE_OPENERS.iter().find(|t| prompt.contains(*t)) {
            return Some(format!(
                "a chat message's content already holds {t}, and the trainer applies the template to the messages again"
            ));
        }
    }
    if count(prompt, "<|im_start|>system") >= 2 {
        return Some("two <|im_start|>system blocks".into());
    }
    if count(prompt, "<|begin_of_text|>") >= 2 {
        return Some("<|begin_of_text|> twice".into());
    }
    if nested(prompt, "<|im_start|>user", &["<|im_start|>"], "<|im_end|>") {
        return Some("<|im_start|> nested inside the user turn".into());
    }
    if nested(
        prompt,
        "<|start_header_id|>user<|end_header_id|>",
        &["<|start_header_id|>", "<|begin_of_text|>"],
        "<|eot_id|>",
    ) {
        return Some("a header or <|begin_of_text|> nested inside the user turn".into());
    }
    None
}

/// Up to two quoted completions, with their step.
fn examples(hits: &[&Completion]) -> Vec<String> {
    hits.iter()
        .take(2)
        .map(|c| match c.step {
            Some(s) => format!("step {s}: {}", quote(&c.text)),
            None => quote(&c.text),
        })
        .collect()
}

fn steps_of(hits: &[&Completion]) -> Vec<i64> {
    let mut s: Vec<i64> = hits.iter().filter_map(|c| c.step).collect();
    s.sort_unstable();
    s.dedup();
    s
}

/// `completions-eos-mismatch`: the completions run to the length cap (`capped`: the
/// metrics' mean truncation ratio) while their text holds the template's end-of-turn
/// token with more text after it.
pub fn eos_mismatch(all: &[&Completion], capped: Option<f64>) -> Option<Finding> {
    let capped = capped.filter(|c| *c >= CAPPED_SHARE)?;
    let hits: Vec<(&Completion, &str)> = all
        .iter()
        .filter_map(|c| runs_past_end(&c.text).map(|t| (*c, t)))
        .collect();
    let share = hits.len() as f64 / all.len() as f64;
    if hits.len() < 2 || share < RUN_PAST_SHARE {
        return None;
    }
    // The end token most completions run past.
    let mut tokens: Vec<(&str, usize)> = Vec::new();
    for (_, t) in &hits {
        match tokens.iter_mut().find(|(x, _)| x == t) {
            Some(e) => e.1 += 1,
            None => tokens.push((t, 1)),
        }
    }
    tokens.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let token = tokens[0].0;
    let cs: Vec<&Completion> = hits.iter().map(|(c, _)| *c).collect();
    let causes = [
        format!("EOS token mismatch: the sampler stops at the tokenizer's eos_token and generation_config.eos_token_id, and neither is the chat template's end token {token}; add {token} to generation_config.eos_token_id (or set the tokenizer's eos_token to it)"),
        format!("tokenizer: {token} added as a plain token (add_tokens), not a special token, so no stop list holds it and skip_special_tokens keeps it in the text"),
        format!("generation config: the inference engine's stop ids / stop strings (vLLM SamplingParams stop_token_ids) lack {token}"),
    ];
    let causes: Vec<&str> = causes.iter().map(String::as_str).collect();
    Some(
        Finding::new(
            "completions-eos-mismatch",
            Severity::Error,
            steps_of(&cs),
            format!(
                "generation does not stop on the chat template's end token: EOS token mismatch (generation_config.eos_token_id): {token} appears inside {} of {} completions ({:.0}%) and generation runs on past it; {:.0}% of completions hit the length cap (metrics)",
                hits.len(),
                all.len(),
                share * 100.0,
                capped * 100.0
            ),
            &causes,
        )
        .with("end_token", token)
        .with("runs_past_end", hits.len())
        .with("completions", all.len())
        .num("runs_past_share", share)
        .num("mean_truncation_ratio", capped)
        .with("examples", examples(&cs))
        .with("likely_cause", "EOS token mismatch"),
    )
}

/// `completions-prompt-templated-twice`: prompts that hold the chat template twice.
pub fn prompt_templated_twice(all: &[&Completion]) -> Option<Finding> {
    let with_prompt: Vec<&Completion> =
        all.iter().copied().filter(|c| c.prompt.is_some()).collect();
    let hits: Vec<(&Completion, String)> = with_prompt
        .iter()
        .filter_map(|c| templated_twice(c.prompt.as_deref()?, c.prompt_is_chat).map(|w| (*c, w)))
        .collect();
    let share = hits.len() as f64 / with_prompt.len().max(1) as f64;
    if hits.len() < 2 || share < TWICE_SHARE.0 {
        return None;
    }
    let (first, what) = &hits[0];
    let cs: Vec<&Completion> = hits.iter().map(|(c, _)| *c).collect();
    Some(
        Finding::new(
            "completions-prompt-templated-twice",
            if share >= TWICE_SHARE.1 {
                Severity::Error
            } else {
                Severity::Warning
            },
            steps_of(&cs),
            format!(
                "prompt templated twice (apply_chat_template on an already templated prompt): {} of {} prompts ({:.0}%) hold the chat template twice ({what}), e.g. {}",
                hits.len(),
                with_prompt.len(),
                share * 100.0,
                quote(first.prompt.as_deref().unwrap_or_default())
            ),
            &[
                "chat template applied twice: the dataset's prompt is already apply_chat_template text and the trainer templates it again (give the trainer plain messages, or a string prompt templated once)",
                "tokenizer: BOS added again to text that already starts with it (add_special_tokens=True on templated text)",
            ],
        )
        .with("templated_twice", hits.len())
        .with("prompts", with_prompt.len())
        .num("templated_twice_share", share)
        .with("what", what.clone())
        .with("example_prompt", quote(first.prompt.as_deref().unwrap_or_default()))
        .with("examples", examples(&cs))
        .with("likely_cause", "prompt templated twice"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_tokens_with_text_after_them() {
        assert_eq!(
            runs_past_end("5<|im_end|>\n<|im_start|>user\nWhat"),
            Some("<|im_end|>")
        );
        assert_eq!(runs_past_end("5<|im_end|>\n"), None);
        assert_eq!(runs_past_end("5"), None);
        assert_eq!(
            runs_past_end("It is 5., Aur\n<|im_start|>user\nSpell cat.<|im_end|>"),
            Some("<|im_end|>")
        );
        assert_eq!(
            runs_past_end("4<|start_header_id|>user"),
            Some("<|eot_id|>")
        );
    }

    #[test]
    fn twice_templated_prompts() {
        let once = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(templated_twice(once, false), None);
        assert!(templated_twice(once, true)
            .unwrap()
            .contains("<|im_start|>"));
        assert_eq!(templated_twice("What is 2+3?", true), None);
        let twice =
            format!("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n{once}<|im_end|>\n");
        assert_eq!(
            templated_twice(&twice, false).as_deref(),
            Some("two <|im_start|>system blocks")
        );
        assert_eq!(
            templated_twice("<|im_start|>user\n<|im_start|>user\nQ<|im_end|>", false).as_deref(),
            Some("<|im_start|> nested inside the user turn")
        );
        assert_eq!(
            templated_twice("<|begin_of_text|><|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>", false).as_deref(),
            Some("<|begin_of_text|> twice")
        );
    }
}
