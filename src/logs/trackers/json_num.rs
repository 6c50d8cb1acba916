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
}
