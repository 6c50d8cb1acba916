//! Numbers in W&B history JSON: a fast path for the plain numbers nearly every value is,
//! exact by construction, and the general parse for the rest.

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

/// Powers of ten that are exact in an f64.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// A plain JSON number (`-12.5`, `3e-05`, `7`) or bare `NaN`, read straight from the
/// bytes when the result is exact by construction (Clinger's fast path: a mantissa below
/// 2^53 times or over an exact power of ten is one correctly rounded operation, so it
/// equals what `str::parse` returns); `None` for anything else, which then takes
/// [`json_number`]. History rows are almost all such numbers.
pub fn fast_number(b: &[u8]) -> Option<f64> {
    if b == b"NaN" {
        return Some(f64::NAN);
    }
    let (neg, digits) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    // Up to 19 digits fit a u64 without overflow.
    let mut m: u64 = 0;
    let mut i = 0;
    let digits_in = |i: &mut usize, m: &mut u64| {
        let start = *i;
        while let Some(d) = digits
            .get(*i)
            .map(|c| c.wrapping_sub(b'0'))
            .filter(|d| *d <= 9)
        {
            *m = m.wrapping_mul(10).wrapping_add(u64::from(d));
            *i += 1;
        }
        *i - start
    };
    let int_digits = digits_in(&mut i, &mut m);
    let mut frac_digits = 0;
    if digits.get(i) == Some(&b'.') {
        i += 1;
        frac_digits = digits_in(&mut i, &mut m);
    }
    let n_digits = int_digits + frac_digits;
    if n_digits == 0 || n_digits > 19 {
        return None;
    }
    let mut exp = -(frac_digits as i32);
    if let Some(e) = digits.get(i..).filter(|e| !e.is_empty()) {
        let (b'e' | b'E') = *e.first()? else {
            return None;
        };
        let e = e.get(1..)?;
        let (eneg, ed) = match e.split_first() {
            Some((b'-', r)) => (true, r),
            Some((b'+', r)) => (false, r),
            _ => (false, e),
        };
        if ed.is_empty() || ed.len() > 3 || !ed.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let v = ed.iter().fold(0i32, |a, d| a * 10 + i32::from(d - b'0'));
        exp += if eneg { -v } else { v };
    }
    if m >= 1 << 53 {
        return None;
    }
    let x = m as f64;
    let x = if exp >= 0 {
        x * *POW10.get(exp as usize)?
    } else {
        x / *POW10.get(exp.unsigned_abs() as usize)?
    };
    Some(if neg { -x } else { x })
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
        for c in ["0.5", "-12.5", "3e-05", "0.6000000000000001", "NaN", "7"] {
            assert!(fast_number(c.as_bytes()).is_some(), "{c}");
        }
        for c in [
            "+1",
            "1e",
            "Infinity",
            "9007199254740993",
            "1e23",
            "\"NaN\"",
        ] {
            assert!(fast_number(c.as_bytes()).is_none(), "{c}");
        }
    }
}
