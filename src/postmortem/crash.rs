//! The crash and the pre-flight summary, from a crash bundle or from the raw events:
//! exception chain, signature, offending batch, token-length statistics.

use serde_json::Value;

use super::traceback::{self, Traceback};
use super::{CrashSummary, Preflight};
use crate::detect::classify;
use crate::logs::crash_bundle::{self, CrashBundle};

fn ints(v: Option<&Value>) -> Vec<i64> {
    v.and_then(Value::as_array)
        .map(|xs| xs.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default()
}

pub(super) fn preflight_of(e: &Value) -> Preflight {
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    Preflight {
        split: text(e, "split"),
        inspected: e.get("inspected").and_then(Value::as_i64),
        prompt_token_stats: e.get("prompt_token_stats").cloned().unwrap_or_default(),
        answer_token_stats: e.get("answer_token_stats").cloned().unwrap_or_default(),
        empty_prompt_indices: ints(e.get("empty_prompt_indices")),
        empty_answer_indices: ints(e.get("empty_answer_indices")),
        examples: e
            .get("example_previews")
            .and_then(Value::as_array)
            .map(|xs| {
                xs.iter()
                    .map(|x| {
                        (
                            x.get("index").and_then(Value::as_i64).unwrap_or(-1),
                            text(x, "prompt_preview"),
                            text(x, "answer_preview"),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

pub(super) fn crash_from_bundle(b: &CrashBundle) -> CrashSummary {
    let tb: Option<Traceback> = b.exception.as_deref().and_then(traceback::parse);
    let (exc_type, message, chain, trainer_frame, classification) = match &tb {
        Some(tb) => {
            let last = tb.last();
            (
                last.map(|l| l.exc_type.clone()).unwrap_or_default(),
                last.map(|l| l.message.clone()).unwrap_or_default(),
                tb.chain.clone(),
                last.and_then(|l| l.last_trainer_frame().cloned()),
                classify::classify(&tb.signature_text()),
            )
        }
        None => {
            let text = b.exception.clone().unwrap_or_default();
            let c = if text.trim().is_empty() {
                classify::classify("")
            } else {
                classify::classify(&text)
            };
            (
                if b.exception.is_some() {
                    "<unparsed>".to_string()
                } else {
                    "<no exception.txt>".to_string()
                },
                text.trim().lines().last().unwrap_or("").to_string(),
                Vec::new(),
                None,
                c,
            )
        }
    };
    CrashSummary {
        source: "bundle",
        bundle: Some(b.name.clone()),
        step: b.step(),
        time: b.time.clone(),
        exception_type: exc_type,
        message,
        classification,
        chain,
        trainer_frame,
        context: b.context.clone(),
        extra: b.extra.clone(),
        missing_files: b.missing.clone(),
        exception_text: b.exception.clone(),
    }
}

pub(super) fn crash_from_event(e: &Value, last_step: Option<i64>) -> CrashSummary {
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let bundle = e
        .get("crash_dir")
        .and_then(Value::as_str)
        .and_then(|d| d.rsplit('/').next())
        .map(str::to_string);
    let (time, name_step) = bundle
        .as_deref()
        .map(crash_bundle::parse_bundle_name)
        .unwrap_or((None, None));
    CrashSummary {
        source: "event",
        bundle,
        step: name_step.or(last_step),
        time,
        exception_type: "<from crash event>".to_string(),
        classification: classify::classify(&message),
        message,
        chain: Vec::new(),
        trainer_frame: None,
        context: None,
        extra: None,
        missing_files: Vec::new(),
        exception_text: None,
    }
}
