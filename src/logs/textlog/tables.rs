//! Column-shaped text logs: notebook progress tables (markdown or text pipes), Megatron's
//! ` iteration N/ M | … |` lines and tqdm postfixes (`…, 39.06s/it, pg=-0.0019, rm=0.53]`).

use super::TextItem;
use crate::logs::steps::parse_number_text;
use crate::model::log::SourceKind;

/// A table header cell as a key: lowercased, spaces as `_`, spaces around `/` dropped
/// (`rewards / match_format` → `rewards/match_format`).
pub(super) fn table_key(cell: &str) -> String {
    let words: Vec<&str> = cell.split_whitespace().collect();
    words.join("_").replace("_/_", "/").to_ascii_lowercase()
}

/// The cells of a pipe (`a | b`, `| a | b |`) or tab separated line, trimmed; `None`
/// for a line with fewer than two cells.
pub(super) fn table_cells(t: &str) -> Option<Vec<&str>> {
    let sep = if t.contains('|') {
        '|'
    } else if t.contains('\t') {
        '\t'
    } else {
        return None;
    };
    let mut cells: Vec<&str> = t.split(sep).map(str::trim).collect();
    if sep == '|' {
        if cells.first().is_some_and(|c| c.is_empty()) {
            cells.remove(0);
        }
        if cells.last().is_some_and(|c| c.is_empty()) {
            cells.pop();
        }
    }
    (cells.len() >= 2).then_some(cells)
}

/// A notebook progress table line (HF `Trainer` in Jupyter, pasted as markdown or text).
pub(super) fn parse_table(t: &str) -> Option<TextItem> {
    let cells = table_cells(t)?;
    if cells
        .iter()
        .all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':' | '=' | '+')))
    {
        return Some(TextItem::TableRule);
    }
    let nums: Vec<Option<f64>> = cells.iter().map(|c| parse_number_text(c)).collect();
    // HF notebook tables write `No log` where nothing was logged at that row.
    let placeholder = |c: &str| {
        matches!(
            c.to_ascii_lowercase().as_str(),
            "no log" | "none" | "n/a" | "-" | ""
        )
    };
    if nums.first().is_some_and(Option::is_some)
        && nums.iter().filter(|n| n.is_some()).count() >= 2
        && nums
            .iter()
            .zip(&cells)
            .all(|(n, c)| n.is_some() || placeholder(c))
    {
        return Some(TextItem::TableRow(nums));
    }
    // A header names its columns (no numbers) and has a step or epoch column.
    let keys: Vec<String> = cells.iter().map(|c| table_key(c)).collect();
    let named = nums.iter().all(Option::is_none) && cells.iter().all(|c| !c.is_empty());
    if named && keys.iter().any(|k| k == "step" || k == "epoch") {
        return Some(TextItem::TableHeader(keys));
    }
    None
}

/// A border of a box-drawn table (tabulate's `fancy_grid`: `╒═══╤═══╕`, `├───┼───┤`,
/// `╘═══╧═══╛`), after any prefix.
pub(super) fn is_box_border(t: &str) -> bool {
    let t = t.trim();
    let body = t
        .find(['╒', '├', '╘', '┌', '└', '╞'])
        .map_or(t, |i| &t[i..]);
    body.chars().count() >= 3
        && body.chars().all(|c| {
            matches!(
                c,
                '╒' | '╤'
                    | '╕'
                    | '├'
                    | '┼'
                    | '┤'
                    | '╘'
                    | '╧'
                    | '╛'
                    | '═'
                    | '─'
                    | '┌'
                    | '┬'
                    | '┐'
                    | '└'
                    | '┴'
                    | '┘'
                    | '╞'
                    | '╪'
                    | '╡'
                    | ' '
            )
        })
}

/// A row of a box-drawn table of `key │ value` pairs (AReaL's `tabulate_stats`: four
/// pairs a row, `│ ppo_actor/task_reward/avg │ 5.0000e-01 │ … │`), after any prefix (a Ray
/// actor's `(MasterWorker pid=…)`): the pairs whose value is a number; `None` when the line
/// is no such row.
pub(super) fn parse_box_row(t: &str) -> Option<Vec<(String, f64)>> {
    let start = t.find('│')?;
    let cells: Vec<&str> = t[start..].split('│').map(str::trim).collect();
    // `│ a │ b │` splits into ["", "a", "b", ""].
    let cells = cells.get(1..cells.len().checked_sub(1)?)?;
    if cells.len() < 2 || cells.len() % 2 != 0 {
        return None;
    }
    let mut out = Vec::new();
    for pair in cells.chunks(2) {
        let (k, v) = (pair[0], pair[1]);
        if k.is_empty() && v.is_empty() {
            continue;
        }
        if k.is_empty() || k.contains(' ') || parse_number_text(k).is_some() {
            return None;
        }
        out.push((k.to_string(), parse_number_text(v)?));
    }
    (!out.is_empty()).then_some(out)
}

/// Megatron-LM / Megatron-DeepSpeed ` iteration N/ M | key: value | … |` lines;
/// `(ms)` in a key converts the value to seconds (`elapsed_time_per_iteration_s`).
pub(super) fn parse_megatron(t: &str) -> Option<TextItem> {
    let pos = t.find("iteration ")?;
    let rest = &t[pos + "iteration ".len()..];
    let (head, body) = rest.split_once('|')?;
    let step: i64 = head.split('/').next()?.trim().parse().ok()?;
    let mut fields = Vec::new();
    for part in body.split('|') {
        let Some((k, v)) = part.split_once(':') else {
            continue;
        };
        let Some(mut v) = parse_number_text(v) else {
            continue;
        };
        let mut key = k.trim().to_string();
        for (unit, scale) in [("(ms)", 1e-3), ("(s)", 1.0)] {
            if let Some(stem) = key.strip_suffix(unit) {
                key = format!("{}_s", stem.trim());
                v *= scale;
            }
        }
        fields.push((table_key(&key), v));
    }
    if fields.is_empty() {
        return None;
    }
    Some(TextItem::Step {
        source: SourceKind::Megatron,
        step: Some(step),
        fields,
        tail: None,
    })
}

/// OpenRLHF's short progress-bar names (`pbar.set_postfix(short_status)` in its PPO
/// trainers) and the metric each abbreviates.
const OPENRLHF_SHORT: &[(&str, &str)] = &[
    ("pg", "policy_loss"),
    ("rm", "reward"),
    ("ret", "return"),
    ("glen", "response_length"),
    ("tlen", "total_length"),
    ("ent", "entropy"),
    ("act_lr", "actor_lr"),
    ("cri", "critic_loss"),
    ("vals", "values"),
    ("ptx", "ptx_loss"),
];

/// A tqdm bar with a postfix, `… 8/8 [05:12<00:00, 39.06s/it, pg=-0.0019, rm=0.53, kl=1e-4]`
/// (OpenRLHF, HF accelerate loops): the `key=value` pairs, unnumbered (a bar restarts every
/// episode, so its counter is not a step).
pub(super) fn parse_tqdm_postfix(t: &str) -> Option<TextItem> {
    if !t.contains("%|") && !t.contains("it/s") && !t.contains("s/it") {
        return None;
    }
    let open = t.rfind('[')?;
    let body = t[open + 1..].trim_end().strip_suffix(']')?;
    let mut fields = Vec::new();
    for part in body.split(", ") {
        let Some((k, v)) = part.split_once('=') else {
            continue;
        };
        let Some(v) = parse_number_text(v) else {
            continue;
        };
        let k = k.trim();
        let key = OPENRLHF_SHORT
            .iter()
            .find(|(short, _)| *short == k)
            .map_or(k, |(_, long)| long);
        fields.push((key.to_string(), v));
    }
    if fields.is_empty() {
        return None;
    }
    Some(TextItem::Step {
        source: SourceKind::TrlDict,
        step: epoch_number(&t[..open]),
        fields,
        tail: None,
    })
}

/// The epoch a bar's description names as `Epoch #N` (tianshou's trainers:
/// `tqdm.tqdm(…, desc=f"Epoch #{self.epoch}")`, whose postfix holds the epoch's metrics);
/// `None` for any other description (`Train epoch [1/1]` counts no step).
fn epoch_number(desc: &str) -> Option<i64> {
    let at = desc.find("Epoch #")?;
    let digits: String = desc[at + "Epoch #".len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}
