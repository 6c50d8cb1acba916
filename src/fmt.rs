//! The one number formatter every renderer uses: significant digits rather than fixed
//! decimals, one notation per column, and pairs printed with as many digits as it takes to
//! show that two different numbers differ (never `-0.2084 ≠ -0.2084`); and the two text
//! helpers every terminal renderer shares (plurals, wrapping to the terminal's width).

/// Significant digits shown by default.
pub const DIGITS: usize = 4;

/// How a number is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notation {
    /// `0.01551`, `1234.5`.
    Fixed,
    /// `1.551e-2`.
    Sci,
}

impl Notation {
    /// The natural notation of `x`: fixed for 1e-3 ≤ |x| < 1e5 (and zero), else scientific.
    pub fn of(x: f64) -> Notation {
        if !x.is_finite() || x == 0.0 || is_int(x) || (1e-3..1e5).contains(&x.abs()) {
            Notation::Fixed
        } else {
            Notation::Sci
        }
    }

    /// One notation for a set of numbers: scientific as soon as one of them needs it.
    pub fn common(xs: impl IntoIterator<Item = f64>) -> Notation {
        if xs.into_iter().any(|x| Notation::of(x) == Notation::Sci) {
            Notation::Sci
        } else {
            Notation::Fixed
        }
    }
}

/// Integers below 1e15 are written as integers (`23`, not `23.00`).
fn is_int(x: f64) -> bool {
    x == x.trunc() && x.abs() < 1e15
}

/// `x` with [`DIGITS`] significant digits in its natural notation: `0.6153`, `13.06`,
/// `1.551e-2`, `23`, `NaN`.
pub fn num(x: f64) -> String {
    sig(x, DIGITS, Notation::of(x))
}

/// `x` with `digits` significant digits in `notation`, trailing zeros trimmed.
pub fn sig(x: f64, digits: usize, notation: Notation) -> String {
    let digits = digits.clamp(1, 17);
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return "0".into();
    }
    if is_int(x) && (notation == Notation::Fixed || x.abs() < 1e5) {
        return format!("{x}");
    }
    let e = format!("{:.*e}", digits - 1, x);
    match notation {
        Notation::Sci => trim_sci(&e),
        Notation::Fixed => {
            let exp: i32 = e
                .rsplit_once('e')
                .and_then(|(_, p)| p.parse().ok())
                .unwrap_or(0);
            let decimals = (digits as i32 - 1 - exp).max(0) as usize;
            trim_fixed(&format!("{x:.decimals$}"))
        }
    }
}

fn trim_fixed(s: &str) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s.to_string()
    }
}

fn trim_sci(s: &str) -> String {
    match s.split_once('e') {
        Some((m, e)) => format!("{}e{e}", trim_fixed(m)),
        None => s.to_string(),
    }
}

/// True when `a` and `b` are one number at the precision a dump stores a scalar in: equal,
/// or apart by at most one f32 rounding unit (`2⁻²³` of the larger): a loss is dumped as
/// `.item()` of an f32 tensor, so `0.0430426` and a recomputed `0.043042596`, equal to 7
/// digits, are the same value. Numbers alike in this sense are never called different
/// (issue 28).
pub fn alike(a: f64, b: f64) -> bool {
    a == b
        || (a.is_finite()
            && b.is_finite()
            && (a - b).abs() <= f64::from(f32::EPSILON) * a.abs().max(b.abs()))
}

/// Two numbers shown side by side (dumped vs recomputed, reference vs other): one notation,
/// and the fewest digits (at least [`DIGITS`]) that make different numbers look different.
pub fn pair(a: f64, b: f64) -> (String, String) {
    let n = Notation::common([a, b]);
    let mut d = DIGITS;
    loop {
        let (sa, sb) = (sig(a, d, n), sig(b, d, n));
        if sa != sb || d >= 17 || a == b || (a.is_nan() && b.is_nan()) {
            return (sa, sb);
        }
        d += 1;
    }
}

/// A column of numbers: one notation for all, [`DIGITS`] significant digits each; in
/// fixed notation one number of decimals for all (`0.320` under `0.315`) unless that would
/// pad a large number past [`DIGITS`] significant digits.
pub fn column(xs: &[f64]) -> Vec<String> {
    let n = Notation::common(xs.iter().copied());
    let texts: Vec<String> = xs.iter().map(|&x| sig(x, DIGITS, n)).collect();
    if n == Notation::Sci {
        return texts;
    }
    let decimals = |t: &str| t.split_once('.').map_or(0, |(_, d)| d.len());
    let d = texts.iter().map(|t| decimals(t)).max().unwrap_or(0);
    let finite = || xs.iter().filter(|x| x.is_finite());
    if d == 0 || d > DIGITS || finite().any(|x| x.abs() >= 10f64.powi((DIGITS - d) as i32)) {
        return texts;
    }
    xs.iter()
        .zip(texts)
        .map(|(x, t)| if x.is_finite() { format!("{x:.d$}") } else { t })
        .collect()
}

/// A number as a command-line argument: exact to 12 significant digits, no float noise
/// (`1e-6`, not `1.0000000000000002e-6`; `0.00125`).
pub fn arg(x: f64) -> String {
    sig(x, 12, Notation::of(x))
}

/// `1 file`, `8 files`.
pub fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// `text` as lines of at most `width` characters (when known), broken between words; the
/// first line starts with `indent`, the others with `indent` and two more spaces. A word
/// longer than the line (a path) stays whole. Ends with a newline.
pub fn wrap(text: &str, width: Option<usize>, indent: &str) -> String {
    let Some(width) = width else {
        return format!("{indent}{text}\n");
    };
    let cont = format!("{indent}  ");
    let mut out = String::new();
    let mut line = indent.to_string();
    let mut empty = true;
    for word in text.split(' ') {
        let len = line.chars().count();
        if !empty && len + 1 + word.chars().count() > width {
            out.push_str(line.trim_end());
            out.push('\n');
            line = cont.clone();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// Short evidence text `k=v, k=v` of a finding's named values (at most `max` of them):
/// floats in the shared notation, strings bare.
pub fn evidence(evidence: &serde_json::Map<String, serde_json::Value>, max: usize) -> String {
    evidence
        .iter()
        .take(max)
        .map(|(k, v)| match v {
            serde_json::Value::Number(n) => match n.as_f64() {
                Some(x) if n.is_f64() => format!("{k}={}", num(x)),
                _ => format!("{k}={n}"),
            },
            serde_json::Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_equal_as_f32_are_alike() {
        // the held-out step's loss: dumped 0.0430426 (an f32), recomputed in f64
        assert!(alike(0.0430426_f32 as f64, 0.043042596));
        assert!(alike(0.0430426, 0.043042596));
        assert!(alike(1.0, 1.0));
        assert!(!alike(0.0430426, 0.0430427));
        assert!(!alike(f64::NAN, f64::NAN));
        assert!(!alike(1.0, 1.0 + 1e-6));
    }

    #[test]
    fn natural_notation() {
        assert_eq!(num(0.615340), "0.6153");
        assert_eq!(num(13.057064), "13.06");
        assert_eq!(num(1.5509905147383042e-2), "0.01551");
        assert_eq!(num(6.973e-4), "6.973e-4");
        assert_eq!(num(-0.0031), "-0.0031");
        assert_eq!(num(23.0), "23");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(-0.0), "0");
        assert_eq!(num(f64::NAN), "NaN");
        assert_eq!(num(f64::NEG_INFINITY), "-inf");
        assert_eq!(num(123456.7), "1.235e5");
        assert_eq!(num(0.5), "0.5");
    }

    #[test]
    fn pairs_show_the_difference() {
        assert_eq!(
            pair(-0.20841, -0.20843),
            ("-0.20841".to_string(), "-0.20843".to_string())
        );
        assert_eq!(pair(1.0, 1.0), ("1".to_string(), "1".to_string()));
        assert_eq!(
            pair(0.001513, 0.650762),
            ("0.001513".into(), "0.6508".into())
        );
        let (a, b) = pair(1.0, 1.0 + 1e-12);
        assert_ne!(a, b);
    }

    #[test]
    fn columns_share_a_notation() {
        assert_eq!(column(&[-0.0031, 6.973e-4]), ["-3.1e-3", "6.973e-4"]);
        assert_eq!(column(&[-0.0031, 0.25, 2.0]), ["-0.0031", "0.25", "2"]);
        assert_eq!(column(&[-0.0031, 0.25]), ["-0.0031", "0.2500"]);
        assert_eq!(column(&[0.315, 0.32, 0.325]), ["0.315", "0.320", "0.325"]);
        assert_eq!(column(&[12.13, 12.2]), ["12.13", "12.20"]);
        assert_eq!(column(&[30.0, 50.0, 0.0]), ["30", "50", "0"]);
        assert_eq!(column(&[1234.6, 0.5]), ["1235", "0.5"]);
    }

    #[test]
    fn arguments_carry_no_float_noise() {
        assert_eq!(arg(1e-5 / 10.0), "1e-6");
        assert_eq!(arg(1.0000000000000002e-6), "1e-6");
        assert_eq!(arg(0.0001), "1e-4");
        assert_eq!(arg(0.00125), "0.00125");
        assert_eq!(arg(3e-4), "3e-4");
        assert_eq!(arg(0.2), "0.2");
    }
}
