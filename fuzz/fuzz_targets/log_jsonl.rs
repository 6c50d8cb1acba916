//! JSON-lines training logs line by line, as logscan reads them: each line parsed, then
//! classified as an event, a verl line or a step record and flattened.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlforensics::model::log::SourceKind;
use rlforensics::logs::{events, steps};

fuzz_target!(|data: &[u8]| {
    for (i, raw) in data.split(|&b| b == b'\n').enumerate() {
        let Ok(text) = std::str::from_utf8(raw) else {
            continue;
        };
        let text = text.trim();
        let Ok(v) = rlforensics::json::parse_value(text) else {
            continue;
        };
        if v.as_dict().is_none() {
            continue;
        }
        let line = i as u64 + 1;
        let mut q = steps::LineQuality::default();
        if events::is_event(&v) {
            let _ = events::parse_event(&v, 0, line, &mut q);
        } else if steps::is_verl_line(&v) {
            let _ = steps::parse_verl_object(&v, 0, line, &mut q);
        } else {
            let _ = steps::parse_step_object(&v, SourceKind::Steps, 0, line, &mut q);
        }
    }
});
