//! `crash`: the run stopped on an error — a `crash` event of a debug trainer's
//! `events.jsonl` (`{"event": "crash", "message": …}`), or a Python traceback in a text log
//! (an `exception` event: the exception line that ends it), or a message that ends a
//! process by itself (a `fatal` event: an NCCL watchdog timeout, `terminate called after
//! throwing`). Errors logged with no training step between them are one incident (a chained exception, torchrun's `ChildFailedError`
//! after its rank's own traceback): its first message is the one quoted, the signature
//! ([`super::classify`]) is looked for in all of them. Incidents with the same first
//! message are one finding. An exception after which the log still reports training steps
//! did not stop the run: an info finding that says so.

use super::classify::classify;
use super::{Context, Detector};
use crate::model::finding::{Finding, Severity};
use crate::model::log::LogEvent;

/// See the module doc.
pub struct Crash;

/// The longest message quoted in the explanation (the evidence keeps all of it).
const QUOTE: usize = 160;

/// Errors with no training step between them.
struct Incident<'a> {
    kind: &'a str,
    events: Vec<&'a LogEvent>,
    /// A step the log reported after it (the run went on).
    went_on: bool,
}

impl Incident<'_> {
    fn first_text(&self) -> &str {
        self.events[0].text.as_deref().unwrap_or("")
    }
}

impl Detector for Crash {
    fn name(&self) -> &'static str {
        "crash"
    }
    fn summary(&self) -> &'static str {
        "the run stopped on an error: a crash event, or a Python traceback in a text log"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &[]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        // the last step each run logged
        let mut last: std::collections::BTreeMap<u32, i64> = Default::default();
        for i in 0..f.len() {
            let e = last.entry(f.run_of(i)).or_insert(i64::MIN);
            *e = (*e).max(f.step(i));
        }
        let last_of = |run: u32| last.get(&run).copied().filter(|l| *l != i64::MIN);
        // incidents: consecutive errors of one kind, file, run and attached step
        let mut incidents: Vec<Incident> = Vec::new();
        for ev in ctx
            .events
            .iter()
            .filter(|e| matches!(e.kind.as_str(), "crash" | "exception" | "fatal"))
        {
            let same = |e: &LogEvent| {
                e.kind == ev.kind && e.file == ev.file && e.run == ev.run && e.step == ev.step
            };
            match incidents.last_mut() {
                Some(i) if same(i.events[0]) => i.events.push(ev),
                _ => incidents.push(Incident {
                    kind: &ev.kind,
                    events: vec![ev],
                    // an exception event is attached to the step reported after it: one
                    // the log did report means the run went on
                    went_on: ev.kind != "crash"
                        && matches!((ev.step, last_of(ev.run)), (Some(s), Some(l)) if s <= l),
                }),
            }
        }
        // findings: incidents with one first message, kind and outcome
        let mut groups: Vec<Vec<Incident>> = Vec::new();
        for inc in incidents {
            let key = |i: &Incident| (i.first_text().to_string(), i.kind.to_string(), i.went_on);
            match groups.iter_mut().find(|g| key(&g[0]) == key(&inc)) {
                Some(g) => g.push(inc),
                None => groups.push(vec![inc]),
            }
        }
        groups
            .into_iter()
            .map(|g| self.finding(&g, &last_of))
            .collect()
    }
}

impl Crash {
    /// The finding of incidents sharing their first message.
    fn finding(&self, g: &[Incident], last_of: &dyn Fn(u32) -> Option<i64>) -> Finding {
        let inc = &g[0];
        let text = inc.first_text();
        // each message once (one exception on every rank of a torchrun log)
        let mut all: Vec<&str> = Vec::new();
        for t in inc.events.iter().filter_map(|e| e.text.as_deref()) {
            if !all.contains(&t) {
                all.push(t);
            }
        }
        let last_step = last_of(inc.events[0].run);
        // a stopped run: the last step it logged (the one the error follows); a run
        // that went on: the step reported after each incident
        let steps: Vec<i64> = match (inc.went_on, last_step) {
            (false, Some(l)) => vec![l],
            _ => g.iter().filter_map(|i| i.events[0].step).collect(),
        };
        let sig = classify(&all.join("\n"));
        let quoted: String = text.chars().take(QUOTE).collect();
        let quoted = if quoted.len() < text.len() {
            format!("{quoted}…")
        } else {
            quoted
        };
        let what = match inc.kind {
            "crash" => "a crash event",
            "fatal" => "a fatal error (no Python traceback)",
            _ => "a Python traceback",
        };
        let explanation = match (inc.went_on, last_step) {
            (true, Some(l)) => format!(
                "{what} ends in `{quoted}` and the log goes on to step {l}: the run did not stop on it"
            ),
            (false, Some(l)) => format!(
                "the run stopped on {what} after step {l} (its last step logged): `{quoted}`"
            ),
            (_, None) => format!("the run stopped on {what}: `{quoted}`"),
        };
        let mut causes: Vec<&str> = Vec::new();
        if sig.id != "unknown" {
            causes.push(sig.title);
            causes.extend(sig.fixes.iter().take(2));
        }
        // a traceback the log went on after (a reward function's exception caught and
        // printed, a library's handled error) is worth knowing, not a problem by itself
        let severity = if inc.went_on {
            Severity::Info
        } else {
            Severity::Error
        };
        let mut finding = Finding::new(self.name(), severity, steps, explanation, &causes)
            .with("message", text)
            .with("line", inc.events[0].line)
            .with("signature", sig.id);
        if all.len() > 1 {
            finding = finding.with("then", all[1..].join(" | "));
        }
        if let Some(l) = last_step {
            finding = finding.with("last_step_logged", l);
        }
        finding.count = g.len();
        finding
    }
}
