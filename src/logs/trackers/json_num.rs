//! Numbers in W&B history JSON: a fast path for the plain numbers nearly every value is,
//! correctly rounded as the general parse is, and the general parse for the rest.

/// A history value as a number: JSON numbers (bare `NaN`/`Infinity` included) and booleans;
/// `None` for strings, media and tables. Nested objects are flattened by the caller.
pub fn json_number(text: &str) -> Option<f64> {
    let t = text.trim();
    match t {
        "true" => Some(1.0),
        "false" => Some(0.0),
        // Rust's parser takes `NaN`, `inf`, `Infinity` in any case; `"NaN"` (a string) is not a number.
        _ => t.parse::<f64>().ok(),
    }
}

/// A plain JSON number (`-12.5`, `3e-05`, `7`, `0.9970000000000001`) or bare `NaN`, read
/// straight from the bytes with `fast_float2` (the crate logscan's JSON-lines reader uses:
/// Clinger's fast path, else Eisel-Lemire, eight digits at a time; correctly rounded, so
/// it equals what `str::parse` returns); `None` for anything else (a leading `+` or `.`,
/// `Infinity`, text around the number), which then takes [`json_number`]. History rows
/// are almost all such numbers.
pub fn fast_number(b: &[u8]) -> Option<f64> {
    if b == b"NaN" {
        return Some(f64::NAN);
    }
    // A digit first, after an optional minus: the forms `str::parse` reads alike (the
    // crate's own `nan`/`inf` spellings are left to the general parse).
    let digits = match b.split_first() {
        Some((b'-', rest)) => rest,
        _ => b,
    };
    if !digits.first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let (x, n) = fast_float2::parse_partial::<f64, _>(b).ok()?;
    (n == b.len()).then_some(x)
}

/// Powers of ten a double holds exactly (10^0 ..= 10^22).
const EXACT_POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// A short decimal at the start of `b` (`[-]digits[.digits]`, a digit first after the
/// minus, at most 19 digits), when it is Clinger's exact case: its digits as an integer
/// `m ≤ 2^53` and at most 22 of them after the point, so `m / 10^k` is one correctly
/// rounded division of two exact doubles and equals what `str::parse` reads. The value
/// and the bytes read; `None` when the number goes on (an exponent, more digits, a second
/// point) or is not that case: the caller then parses it in full.
#[inline]
pub fn short_decimal(b: &[u8]) -> Option<(f64, usize)> {
    let neg = b.first() == Some(&b'-');
    let mut at = usize::from(neg);
    let (mut m, mut digits, mut frac) = (0u64, 0usize, None::<usize>);
    while let Some(&c) = b.get(at) {
        match c {
            b'0'..=b'9' => {
                m = m.wrapping_mul(10).wrapping_add(u64::from(c - b'0'));
                digits += 1;
            }
            b'.' if frac.is_none() && digits > 0 => frac = Some(digits),
            _ => break,
        }
        at += 1;
    }
    let k = frac.map_or(0, |f| digits - f);
    if digits == 0
        || digits > 19
        || m > 1 << 53
        || matches!(b.get(at), Some(b'e' | b'E' | b'.' | b'_'))
    {
        return None;
    }
    let v = m as f64 / *EXACT_POW10.get(k)?;
    Some((if neg { -v } else { v }, at))
}

/// A plain number at the start of `b` as [`fast_number`] takes it (a digit first, after
/// an optional minus), read as far as it goes: [`short_decimal`], else `fast_float2`. The
/// value and the bytes read; the caller checks what follows ends the field.
#[inline]
pub fn number_prefix(b: &[u8]) -> Option<(f64, usize)> {
    let digits = match b.split_first() {
        Some((b'-', rest)) => rest,
        _ => b,
    };
    if !digits.first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    short_decimal(b).or_else(|| fast_float2::parse_partial::<f64, _>(b).ok())
}

/// An integer of 1–18 ASCII digits at the start of `b` (what `i64` parsing reads alike),
/// and the bytes read.
#[inline]
pub fn digits_prefix(b: &[u8]) -> Option<(i64, usize)> {
    let n = b.iter().take(19).take_while(|c| c.is_ascii_digit()).count();
    if n == 0 || n > 18 {
        return None;
    }
    let v = b
        .get(..n)?
        .iter()
        .fold(0i64, |s, &c| s * 10 + i64::from(c - b'0'));
    Some((v, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_path_equals_the_general_parse_or_declines() {
        let cases = [
            "0",
            "-0",
            "7",
            "0.5",
            "-12.5",
            "1.",
            ".5",
            "3e-05",
            "1E5",
            "-2.5e+3",
            "00012",
            "0.6000000000000001",
            "0.30000000000000004",
            "123456789012345678",
            "9007199254740993",
            "1e22",
            "1e23",
            "1.5e-300",
            "1e-22",
            "0.00000000000000000001",
            "1.000000000000000000000",
            "NaN",
            "Infinity",
            "-Infinity",
            "+1",
            "1e",
            "-",
            "",
            "\"NaN\"",
            "true",
            "1_0",
            "0x10",
            "1.2.3",
            "1e1000",
            "0.9970000000000001",
            "1.7976931348623157e308",
            "2.2250738585072014e-308",
            "5e-324",
            "-0.0",
            "123456789012345678901234567890",
            "0.1000000000000000055511151231257827",
            "1700000123.5",
        ];
        for c in cases {
            let general = json_number(c);
            if let Some(v) = fast_number(c.as_bytes()) {
                let g = general.unwrap_or_else(|| panic!("{c}: fast {v}, general none"));
                assert!(
                    v.to_bits() == g.to_bits() || (v.is_nan() && g.is_nan()),
                    "{c}: {v} vs {g}"
                );
            }
        }
        // The fast path takes the plain forms (the rest go the general way).
        for c in [
            "0.5",
            "-12.5",
            "3e-05",
            "0.6000000000000001",
            "0.9970000000000001",
            "9007199254740993",
            "1e23",
            "NaN",
            "7",
        ] {
            assert!(fast_number(c.as_bytes()).is_some(), "{c}");
        }
        for c in ["+1", ".5", "1e", "1_0", "Infinity", "-NaN", "\"NaN\"", " 1"] {
            assert!(fast_number(c.as_bytes()).is_none(), "{c}");
        }
    }

    /// The short-decimal path equals `str::parse` on every form it takes, and declines
    /// what it must leave to the full parse.
    #[test]
    fn short_decimals_equal_the_general_parse() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut cases: Vec<String> = [
            "0",
            "-0",
            "0.",
            "1.",
            "-0.0",
            "7",
            "0.5",
            "0.507",
            "0.5720000000000001",
            "0.6000000000000001",
            "0.9970000000000001",
            "9007199254740992",
            "9007199254740993",
            "1234567890123456789",
            "12345678901234567890",
            "0.0000000000000000000001",
            "0.00000000000000000000001",
            "00012",
            "1e5",
            "1.5e3",
            "1..2",
            "1.2.3",
            "-",
            "-.5",
            "1_0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for _ in 0..200_000 {
            let r = next();
            let digits = (r % 20 + 1) as usize;
            let point = (r >> 8) as usize % (digits + 2);
            let mut s = String::new();
            if r >> 20 & 1 == 1 {
                s.push('-');
            }
            for d in 0..digits {
                if d == point && d > 0 {
                    s.push('.');
                }
                s.push((b'0' + (next() % 10) as u8) as char);
            }
            cases.push(s);
            cases.push(format!(
                "{}",
                f64::from_bits(next()) * 0.0 + (next() % 1_000_000) as f64 / 997.0
            ));
        }
        let mut taken = 0;
        for c in &cases {
            let Some((v, n)) = short_decimal(c.as_bytes()) else {
                continue;
            };
            taken += 1;
            let want: f64 = c[..n]
                .parse()
                .unwrap_or_else(|_| panic!("{c}: general none"));
            assert_eq!(v.to_bits(), want.to_bits(), "{c}");
            if n < c.len() {
                assert!(
                    !matches!(c.as_bytes()[n], b'0'..=b'9' | b'e' | b'E' | b'.'),
                    "{c}"
                );
            }
        }
        assert!(taken > 100_000, "{taken}");
        for c in [
            "1e5",
            "1.2.3",
            "-",
            "-.5",
            "12345678901234567890",
            "9007199254740993",
            "1_0",
        ] {
            assert!(short_decimal(c.as_bytes()).is_none(), "{c}");
        }
        assert!(short_decimal(b"0.000000000000000001").is_some());
        assert!(short_decimal(b"0.0000000000000000001").is_none());
    }
}
