//! The step a record's prefix names (`step 12: {…}`, `[iteration 5] …`), below both the
//! line parsers (`lines.rs`) and the `key: value` parser (`kv.rs`) that use it, so that
//! neither imports the other.

/// Words that, followed by a number, give the step of what follows them (`step 12:`,
/// `iteration 5 |`; slime's `perf 3: {…}` and `rollout 3: {…}` name the rollout id).
const PREFIX_WORDS: &[&str] = &[
    "step",
    "global_step",
    "iteration",
    "iter",
    "perf",
    "rollout",
];

/// The step named by the text before a record (`… step 12: `, `[iteration 5]`), if any:
/// the last step word followed by an integer (optionally `/N`) and then only separators.
pub(super) fn prefix_step(prefix: &str) -> Option<i64> {
    let lower = prefix.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let mut best = None;
    for w in PREFIX_WORDS {
        let mut from = 0;
        while let Some(off) = lower[from..].find(w) {
            let at = from + off;
            from = at + w.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let rest = &lower[at + w.len()..];
            let rest = rest.trim_start_matches([' ', ':', '=', '#']);
            let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            if digits.is_empty() {
                continue;
            }
            let after = rest[digits.len()..].trim_start();
            let after = match after.strip_prefix('/') {
                Some(r) => r.trim_start_matches(|c: char| c.is_ascii_digit()),
                None => after,
            };
            // Only separators may follow: the record starts right after the step.
            if after
                .chars()
                .all(|c| matches!(c, ':' | ' ' | ']' | ')' | '|' | ',' | '-' | '='))
            {
                if let Ok(n) = digits.parse::<i64>() {
                    if best.is_none_or(|(a, _)| at > a) {
                        best = Some((at, n));
                    }
                }
            }
        }
    }
    best.map(|(_, n)| n)
}

/// The count of a tqdm bar printed before a record on the same line (`  1%|█▍   | 9/860
/// [00:43<1:05:18,  4.60s/it]{'loss': nan, …}`: LLaMA-Factory's and ChatGLM-Efficient-
/// Tuning's PPO loops print step k's record while the bar still shows k, 0-based), if any:
/// the last `| N/M [` of the prefix.
pub(super) fn tqdm_step(prefix: &str) -> Option<i64> {
    let open = prefix.rfind('[')?;
    let before = prefix[..open].trim_end();
    let (n, m) = before.rsplit_once('|')?.1.trim().split_once('/')?;
    let total = m.trim().parse::<i64>().ok()?;
    let n = n.trim().parse::<i64>().ok()?;
    (n <= total).then_some(n)
}

/// The count of a line that is only a tqdm bar (`  1%|▏    | 22/1752 [01:02<1:21:36,
/// 2.83s/it]`, `Training Progress:   3%|▎   | 1/30 [10:37<…]`), if it is one: a percentage
/// before the first `|`, the count after the last, nothing after the bar's `]` (or a bar
/// cut before it).
pub(super) fn bar_only(t: &str) -> Option<i64> {
    let (head, _) = t.split_once('|')?;
    // a postfix (`7.61s/it, pg=-0.0019, kl=…]`) makes it a record (OpenRLHF's bars)
    // (a record after a bar cut before its `]`: `| 2/13000 [00:28<…, 15.11s/it{'loss': …}`)
    if !head.trim_end().ends_with('%') || t.contains('=') || t.contains('{') {
        return None;
    }
    let after = match t.rfind(']') {
        Some(i) => t[i + 1..].trim(),
        None => "",
    };
    if !after.is_empty() {
        return None;
    }
    tqdm_step(t).or_else(|| tqdm_step(&format!("{t} [")))
}

#[cfg(test)]
mod tests {
    use super::{bar_only, tqdm_step};

    #[test]
    fn a_bar_alone_on_its_line() {
        assert_eq!(
            bar_only("  1%|▏         | 22/1752 [01:02<1:21:36,  2.83s/it]"),
            Some(22)
        );
        assert_eq!(
            bar_only("Training Progress:   3%|▎         | 1/30 [10:37<5:08:06, 637.47s/it]"),
            Some(1)
        );
        assert_eq!(
            bar_only("  1%|█▍   | 9/860 [00:43<1:05:18,  4.60s/it]{'loss': nan}"),
            None
        );
        assert_eq!(bar_only("step | loss | reward"), None);
        assert_eq!(
            bar_only("  0%|   | 2/13000 [00:28<54:33:11, 15.11s/it{'loss': 0.2527}"),
            None
        );
    }

    #[test]
    fn tqdm_bar_count_is_the_step() {
        assert_eq!(
            tqdm_step("  1%|█▍      | 9/860 [00:43<1:05:18,  4.60s/it]"),
            Some(9)
        );
        // A bar cut before its `]`.
        assert_eq!(
            tqdm_step("  0%|   | 2/13000 [00:28<54:33:11, 15.11s/it"),
            Some(2)
        );
        assert_eq!(tqdm_step("[INFO] step 3 ["), None);
        assert_eq!(tqdm_step("ratio | 3/2 ["), None);
    }
}
