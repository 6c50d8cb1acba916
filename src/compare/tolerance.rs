//! Tolerances: torch.testing's per-dtype defaults, per-tensor rules from a TOML file
//! (name glob → atol, rtol, allowed fraction, severity), and the pass/warn/fail verdict.
//! [`Tolerance`] is the one tolerance type: dumpdiff judges against a reference side,
//! losscheck symmetrically ([`RelativeTo`]); both with the same NaN and infinity rule.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Position, Result};
pub use crate::model::finding::Severity;
use crate::tensor::DType;

/// Tolerance rules speak the one severity scale of findings ([`Severity`]) but in the
/// words of the tolerance file and of dumpdiff's JSON report: `warn` (≙
/// [`Severity::Warning`]; [`Severity::Info`] is written `warn` too) and `fail` (≙
/// [`Severity::Error`]; [`Severity::Critical`] is written `fail` too). So the TOML keeps
/// its words and the JSON report stays as it was.
pub mod rule_severity {
    use super::Severity;
    use serde::{Deserialize, Deserializer, Serializer};

    /// The tolerance-file word for `s`.
    pub fn word(s: Severity) -> &'static str {
        match s {
            Severity::Info | Severity::Warning => "warn",
            Severity::Error | Severity::Critical => "fail",
        }
    }

    /// `warn` or `fail`.
    pub fn serialize<S: Serializer>(s: &Severity, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(word(*s))
    }

    /// `warn` → warning, `fail` → error; any other word is refused naming both.
    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Severity, D::Error> {
        let w = String::deserialize(de)?;
        match w.as_str() {
            "warn" => Ok(Severity::Warning),
            "fail" => Ok(Severity::Error),
            other => Err(serde::de::Error::unknown_variant(other, &["warn", "fail"])),
        }
    }

    /// The same for an optional severity (a rule's `severity` key may be absent).
    pub mod option {
        use super::Severity;
        use serde::{Deserializer, Serializer};

        /// `warn`, `fail`, or nothing.
        pub fn serialize<S: Serializer>(s: &Option<Severity>, ser: S) -> Result<S::Ok, S::Error> {
            match s {
                Some(s) => super::serialize(s, ser),
                None => ser.serialize_none(),
            }
        }

        /// `warn` or `fail` (the key's absence is handled by `#[serde(default)]`).
        pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Option<Severity>, D::Error> {
            super::deserialize(de).map(Some)
        }
    }
}

/// The outcome of one comparison, cell or section; ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Nothing to compare here (e.g. a tensor only one producer dumps).
    Skipped,
    /// Within tolerance.
    Pass,
    /// Present on one side only (coverage, not values).
    Missing,
    /// Beyond tolerance at warn severity.
    Warn,
    /// Beyond tolerance.
    Fail,
}

impl Verdict {
    /// The one-character symbol of the terminal grid.
    pub fn symbol(self) -> &'static str {
        match self {
            Verdict::Skipped => "·",
            Verdict::Pass => "✓",
            Verdict::Missing => "–",
            Verdict::Warn => "!",
            Verdict::Fail => "✗",
        }
    }

    /// True when this verdict reaches `fail_on` (missing files count as warnings): at
    /// `error` and above only FAIL does, at `warning` and below WARN and missing files too.
    pub fn reaches(self, fail_on: Severity) -> bool {
        if fail_on >= Severity::Error {
            self == Verdict::Fail
        } else {
            matches!(self, Verdict::Fail | Verdict::Warn | Verdict::Missing)
        }
    }
}

/// What the relative part of a [`Tolerance`] scales with: the one place where dumpdiff and
/// losscheck judge a pair differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RelativeTo {
    /// `rtol·|a|`, `a` being the reference side (torch.testing's `expected`): dumpdiff,
    /// where one implementation is the reference.
    #[default]
    Reference,
    /// `rtol·max(|a|, |b|)`, symmetric: losscheck, a dumped value against its own
    /// recomputation, where neither side is the reference.
    Larger,
}

impl RelativeTo {
    fn is_reference(&self) -> bool {
        *self == RelativeTo::Reference
    }
}

/// The tolerance one pair `(a, b)` is judged against, in both dumpdiff and losscheck.
///
/// The one rule (see [`Tolerance::allows_with`]): NaN equals NaN and nothing else; an
/// infinity equals only the same infinity (never a finite value, however large `rtol`);
/// two finite values are within when `|a − b| ≤ atol + rtol·s`, `s` per
/// [`Tolerance::relative_to`] (`|a|`, `a` the reference side, by default).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
    /// Fraction of elements allowed beyond tolerance before the verdict turns.
    pub allowed_fraction: f64,
    /// What a pair beyond tolerance is (written `warn`/`fail`, see [`rule_severity`]).
    #[serde(with = "rule_severity")]
    pub severity: Severity,
    /// Where these numbers came from (`dtype default bfloat16`, a rule's glob, `--atol/--rtol`).
    pub source: String,
    /// What `rtol` scales with (not written to reports when it is the reference side).
    #[serde(skip_serializing_if = "RelativeTo::is_reference")]
    pub relative_to: RelativeTo,
}

/// The self-consistency tolerance ([`Tolerance::self_consistency`] at rtol 1e-4, atol
/// 1e-6: an f32 dump against its f64 recomputation); comparisons of two implementations
/// start from [`Tolerance::for_dtype`] instead.
impl Default for Tolerance {
    fn default() -> Self {
        Tolerance::self_consistency(1e-6, 1e-4)
    }
}

impl Tolerance {
    /// A fail-severity tolerance with no allowed fraction, relative to the reference side.
    pub fn new(atol: f64, rtol: f64, source: impl Into<String>) -> Self {
        Tolerance {
            atol,
            rtol,
            allowed_fraction: 0.0,
            severity: Severity::Error,
            source: source.into(),
            relative_to: RelativeTo::Reference,
        }
    }

    /// losscheck's "dumped equals recomputed": symmetric ([`RelativeTo::Larger`]).
    pub fn self_consistency(atol: f64, rtol: f64) -> Self {
        Tolerance {
            relative_to: RelativeTo::Larger,
            ..Tolerance::new(atol, rtol, "self-consistency")
        }
    }

    /// torch.testing's defaults for `dtype` (integers and bools compare exactly).
    pub fn for_dtype(dtype: DType) -> Self {
        let (atol, rtol) = match dtype {
            DType::F64 => (1e-7, 1e-7),
            DType::F32 => (1e-5, 1.3e-6),
            DType::F16 => (1e-5, 1e-3),
            DType::BF16 => (1e-5, 1.6e-2),
            _ => (0.0, 0.0),
        };
        Tolerance::new(atol, rtol, format!("dtype default {}", dtype.torch_name()))
    }

    /// Is `(a, b)` within tolerance? `a` is the reference value (torch's `expected`).
    pub fn allows(&self, a: f64, b: f64) -> bool {
        self.allows_with(a, b, 0.0)
    }

    /// The allowed `|a − b|` at reference value `a`: `atol + rtol·|a|` (the band error
    /// propagation starts from, see [`crate::compare::propagate`]).
    pub fn allowed(&self, a: f64) -> f64 {
        self.atol + self.rtol * a.abs()
    }

    /// The allowed `|a − b|` for the pair `(a, b)`: [`Tolerance::allowed`] at `a`, or
    /// `atol + rtol·max(|a|, |b|)` when [`RelativeTo::Larger`].
    pub fn allowed_pair(&self, a: f64, b: f64) -> f64 {
        match self.relative_to {
            RelativeTo::Reference => self.allowed(a),
            RelativeTo::Larger => self.atol + self.rtol * b.abs().max(a.abs()),
        }
    }

    /// [`Tolerance::allows`] with `extra` added to the allowed difference: the error a
    /// derived element inherits from its inputs (see [`crate::compare::propagate`]). The
    /// rule of [`Tolerance`]: NaN equals NaN only, ±Inf equals itself only.
    pub fn allows_with(&self, a: f64, b: f64, extra: f64) -> bool {
        if a.is_nan() || b.is_nan() {
            return a.is_nan() && b.is_nan();
        }
        if a == b {
            return true;
        }
        if a.is_infinite() || b.is_infinite() {
            return false;
        }
        (a - b).abs() <= self.allowed_pair(a, b) + extra
    }

    /// The verdict for `beyond` of `count` elements beyond tolerance, with the reason.
    pub fn verdict(&self, beyond: u64, count: u64) -> (Verdict, String) {
        if count == 0 {
            return (Verdict::Skipped, "no valid positions to compare".into());
        }
        let frac = beyond as f64 / count as f64;
        if beyond == 0 || frac <= self.allowed_fraction {
            let why = if beyond == 0 {
                format!(
                    "all {count} within atol {:e} rtol {:e}",
                    self.atol, self.rtol
                )
            } else {
                format!(
                    "{beyond}/{count} beyond tolerance, within allowed fraction {}",
                    self.allowed_fraction
                )
            };
            return (Verdict::Pass, why);
        }
        let v = if self.severity >= Severity::Error {
            Verdict::Fail
        } else {
            Verdict::Warn
        };
        (
            v,
            format!(
                "{beyond}/{count} beyond atol {:e} rtol {:e} ({})",
                self.atol, self.rtol, self.source
            ),
        )
    }
}

/// The coarser of two dtypes for tolerance purposes (bf16 > f16 > f32 > f64 in looseness).
pub fn coarser(a: DType, b: DType) -> DType {
    let rank = |d: DType| match d {
        DType::BF16 => 4,
        DType::F16 => 3,
        DType::F32 => 2,
        DType::F64 => 1,
        _ => 0,
    };
    if rank(a) >= rank(b) {
        a
    } else {
        b
    }
}

/// How much a derived RL quantity amplifies the relative error of its log-prob inputs:
/// `exp` turns an absolute log-space error into a relative one (ratios, elementwise
/// losses: 2×), squared log-ratios (approx_kl and other KL estimates: 4×).
pub fn derived_rtol_factor(name: &str) -> f64 {
    let leaf = name.rsplit('.').next().unwrap_or(name);
    if leaf.contains("kl") {
        4.0
    } else if leaf.contains("ratio") || leaf.contains("elementwise") {
        2.0
    } else {
        1.0
    }
}

/// One `[[rule]]` of a tolerance file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Glob (`*`, `?`) matched against the full name (`is_loss.prob_ratio`,
    /// `loss.metrics.approx_kl`) and against the last component (`prob_ratio`).
    pub name: String,
    /// Absolute tolerance (default: the dtype default's).
    pub atol: Option<f64>,
    /// Relative tolerance (default: the dtype default's).
    pub rtol: Option<f64>,
    /// Fraction of elements allowed beyond tolerance (default 0).
    pub allowed_fraction: Option<f64>,
    /// `warn` or `fail` (default fail), see [`rule_severity`].
    #[serde(default, with = "rule_severity::option")]
    pub severity: Option<Severity>,
}

/// The rules of a tolerance file, tried in order; the first match wins.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToleranceRules {
    /// The rules, in file order.
    #[serde(default, rename = "rule")]
    pub rules: Vec<Rule>,
}

/// Everything that decides a pair's tolerance: file rules, then command-line overrides.
#[derive(Debug, Clone, Default)]
pub struct TolerancePolicy {
    /// Rules from `--tol-file`.
    pub rules: ToleranceRules,
    /// `--atol` (overrides everything when given).
    pub atol: Option<f64>,
    /// `--rtol` (overrides everything when given).
    pub rtol: Option<f64>,
}

impl ToleranceRules {
    /// Parse a tolerance file's text; errors name `path` and the line.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let rules: ToleranceRules = toml::from_str(text).map_err(|e| {
            let pos = match e.span() {
                Some(span) => {
                    let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                    Position::Line(line as u64)
                }
                None => Position::File,
            };
            Error::format(path, pos, e.message().to_string())
        })?;
        for (i, r) in rules.rules.iter().enumerate() {
            let bad = |what: &str| {
                Error::format(
                    path,
                    Position::Key(format!("rule[{i}].{what}")),
                    format!("{what} must be a finite number ≥ 0"),
                )
            };
            for (what, v) in [("atol", r.atol), ("rtol", r.rtol)] {
                if v.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
                    return Err(bad(what));
                }
            }
            if r.allowed_fraction
                .is_some_and(|f| !(0.0..=1.0).contains(&f))
            {
                return Err(Error::format(
                    path,
                    Position::Key(format!("rule[{i}].allowed_fraction")),
                    "allowed_fraction must be between 0 and 1",
                ));
            }
        }
        Ok(rules)
    }

    /// Read and parse a tolerance file (a local path or an object-storage URL).
    pub fn load(path: &Path) -> Result<Self> {
        let text = if crate::formats::source::is_remote(path) {
            String::from_utf8(crate::formats::source::read_all(path)?)
                .map_err(|e| Error::format(path, Position::File, format!("not UTF-8: {e}")))?
        } else {
            std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?
        };
        Self::parse(&text, path)
    }

    /// The first rule matching `name` (full dotted name or its last component).
    pub fn find(&self, name: &str) -> Option<&Rule> {
        let leaf = name.rsplit('.').next().unwrap_or(name);
        self.rules
            .iter()
            .find(|r| glob_match(&r.name, name) || glob_match(&r.name, leaf))
    }
}

impl TolerancePolicy {
    /// True when `--atol`/`--rtol` override every tolerance (propagation is off then).
    pub fn overridden(&self) -> bool {
        self.atol.is_some() || self.rtol.is_some()
    }

    /// The tolerance for the pair called `name` whose coarser effective dtype is `dtype`.
    /// `derived` says the values are computed downstream of log-probs at that precision,
    /// so the dtype default's rtol is scaled by [`derived_rtol_factor`].
    pub fn resolve(&self, name: &str, dtype: DType, derived: bool) -> Tolerance {
        let mut t = Tolerance::for_dtype(dtype);
        if derived && dtype.is_float() {
            let f = derived_rtol_factor(name);
            if f != 1.0 {
                t.rtol *= f;
                t.source = format!("{} ×{f} (derived from log-probs)", t.source);
            }
        }
        if let Some(rule) = self.rules.find(name) {
            t.atol = rule.atol.unwrap_or(t.atol);
            t.rtol = rule.rtol.unwrap_or(t.rtol);
            t.allowed_fraction = rule.allowed_fraction.unwrap_or(0.0);
            t.severity = rule.severity.unwrap_or(Severity::Error);
            t.source = format!("rule '{}'", rule.name);
        }
        if self.atol.is_some() || self.rtol.is_some() {
            t.atol = self.atol.unwrap_or(t.atol);
            t.rtol = self.rtol.unwrap_or(t.rtol);
            t.source = "--atol/--rtol".into();
        }
        t
    }
}

/// Shell-style glob with `*` (any run, including dots) and `?` (one character).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_testing_defaults() {
        let t = Tolerance::for_dtype(DType::F32);
        assert_eq!((t.atol, t.rtol), (1e-5, 1.3e-6));
        let t = Tolerance::for_dtype(DType::BF16);
        assert_eq!((t.atol, t.rtol), (1e-5, 1.6e-2));
        let t = Tolerance::for_dtype(DType::F16);
        assert_eq!((t.atol, t.rtol), (1e-5, 1e-3));
        let t = Tolerance::for_dtype(DType::F64);
        assert_eq!((t.atol, t.rtol), (1e-7, 1e-7));
        let t = Tolerance::for_dtype(DType::I64);
        assert!(t.allows(3.0, 3.0) && !t.allows(3.0, 4.0));
    }

    #[test]
    fn allows_scales_with_reference() {
        let t = Tolerance::new(0.0, 0.1, "t");
        assert!(t.allows(10.0, 11.0));
        assert!(!t.allows(1.0, 1.2));
        assert!(t.allows(f64::NAN, f64::NAN));
        assert!(!t.allows(f64::NAN, 0.0));
        assert!(t.allows(f64::NEG_INFINITY, f64::NEG_INFINITY));
        assert!(!t.allows(f64::INFINITY, f64::NEG_INFINITY));
    }

    /// losscheck's tolerance is symmetric and keeps the one infinity rule: before the two
    /// types were merged, its `|a − b| ≤ atol + rtol·max(|a|, |b|)` called +inf close to any
    /// finite value (inf ≤ inf) and +inf not close to +inf (NaN ≤ x).
    #[test]
    fn self_consistency_is_symmetric_with_the_same_infinity_rule() {
        let t = Tolerance::default();
        assert_eq!(
            (t.atol, t.rtol, t.relative_to),
            (1e-6, 1e-4, RelativeTo::Larger)
        );
        // |a − b| = 1.00105e-3: within 1e-6 + 1e-4·10.00100105 = 1.0011001e-3 (scaled by
        // the larger), beyond 1e-6 + 1e-4·10 = 1.001e-3 (scaled by the smaller as reference).
        let (lo, hi) = (10.0, 10.00100105);
        assert!(t.allows(lo, hi) && t.allows(hi, lo));
        let r = Tolerance::new(1e-6, 1e-4, "r");
        assert!(r.allows(hi, lo) && !r.allows(lo, hi));
        assert!(t.allows(f64::INFINITY, f64::INFINITY));
        assert!(!t.allows(f64::INFINITY, 5.0) && !t.allows(5.0, f64::INFINITY));
        assert!(!t.allows(f64::INFINITY, f64::NEG_INFINITY));
        assert!(t.allows(f64::NAN, f64::NAN) && !t.allows(f64::NAN, 1.0));
    }

    #[test]
    fn verdict_uses_allowed_fraction_and_severity() {
        let mut t = Tolerance::new(0.0, 0.0, "t");
        assert_eq!(t.verdict(0, 10).0, Verdict::Pass);
        assert_eq!(t.verdict(1, 10).0, Verdict::Fail);
        t.allowed_fraction = 0.1;
        assert_eq!(t.verdict(1, 10).0, Verdict::Pass);
        t.severity = Severity::Warning;
        assert_eq!(t.verdict(2, 10).0, Verdict::Warn);
        assert_eq!(t.verdict(0, 0).0, Verdict::Skipped);
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", "a.b"));
        assert!(glob_match("is_loss.*ratio", "is_loss.prob_ratio"));
        assert!(glob_match(
            "loss.metrics.?pprox_kl",
            "loss.metrics.approx_kl"
        ));
        assert!(!glob_match("loss.*", "is_loss.loss"));
        assert!(glob_match("*loss", "is_loss.loss"));
        assert!(!glob_match("a?", "a"));
    }

    #[test]
    fn rules_override_defaults_in_order() {
        let text = r#"
[[rule]]
name = "prob_ratio"
rtol = 0.05
allowed_fraction = 0.1
severity = "warn"

[[rule]]
name = "*"
atol = 1e-3
"#;
        let rules = ToleranceRules::parse(text, Path::new("t.toml")).unwrap();
        let policy = TolerancePolicy {
            rules,
            ..Default::default()
        };
        let t = policy.resolve("is_loss.prob_ratio", DType::F32, false);
        assert_eq!((t.atol, t.rtol, t.allowed_fraction), (1e-5, 0.05, 0.1));
        assert_eq!(t.severity, Severity::Warning);
        let t = policy.resolve("forward_data.log_probs", DType::BF16, false);
        assert_eq!((t.atol, t.rtol), (1e-3, 1.6e-2));
        let cli = TolerancePolicy {
            atol: Some(0.5),
            ..policy
        };
        assert_eq!(cli.resolve("x", DType::F32, false).atol, 0.5);
    }

    #[test]
    fn derived_quantities_scale_rtol() {
        let p = TolerancePolicy::default();
        assert_eq!(
            p.resolve("is_loss.prob_ratio", DType::BF16, true).rtol,
            3.2e-2
        );
        assert_eq!(
            p.resolve("loss.metrics.approx_kl", DType::BF16, true).rtol,
            6.4e-2
        );
        assert_eq!(p.resolve("loss.loss", DType::BF16, true).rtol, 1.6e-2);
        assert_eq!(
            p.resolve("is_loss.prob_ratio", DType::BF16, false).rtol,
            1.6e-2
        );
    }

    #[test]
    fn bad_rule_file_names_line() {
        let err = ToleranceRules::parse("[[rule]]\nname = 3\n", Path::new("tol.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("tol.toml: line 2"), "{err}");
        let err = ToleranceRules::parse("[[rule]]\nname = \"x\"\nrtol = -1.0\n", Path::new("t"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("rule[0].rtol"), "{err}");
    }

    #[test]
    fn rule_severity_keeps_the_words_warn_and_fail() {
        let text = "[[rule]]\nname = \"a\"\nseverity = \"warn\"\n\n[[rule]]\nname = \"b\"\nseverity = \"fail\"\n";
        let rules = ToleranceRules::parse(text, Path::new("t.toml")).unwrap();
        assert_eq!(rules.rules[0].severity, Some(Severity::Warning));
        assert_eq!(rules.rules[1].severity, Some(Severity::Error));
        let json = serde_json::to_string(&rules.rules[0]).unwrap();
        assert!(json.contains(r#""severity":"warn""#), "{json}");
        let mut t = Tolerance::new(0.0, 0.0, "t");
        assert_eq!(
            serde_json::to_value(&t).unwrap()["severity"],
            serde_json::json!("fail")
        );
        t.severity = Severity::Critical;
        assert_eq!(t.verdict(1, 1).0, Verdict::Fail);
        t.severity = Severity::Info;
        assert_eq!(t.verdict(1, 1).0, Verdict::Warn);
        let err = ToleranceRules::parse(
            "[[rule]]\nname = \"a\"\nseverity = \"error\"\n",
            Path::new("t.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("unknown variant `error`, expected `warn` or `fail`"),
            "{err}"
        );
    }
}
