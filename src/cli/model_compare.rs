//! `dumpdiff A B --step N`: two dumps of one step from any known producers, each detected
//! from its files ([`crate::producers::step_reader_for`]), compared through the model
//! ([`crate::dumpdiff::model_compare`]).

use std::path::{Path, PathBuf};

use crate::dumpdiff::model_compare::{compare, Closeness};
use crate::exit_codes::{EXIT_CLEAN, EXIT_FOUND};
use crate::producers::mapping::Mapping;
use crate::producers::{step_reader_for, StepReader};
use crate::render::Format;
use crate::Error;

/// Compare `dumps` (exactly two; a side `mapping` matches is read with it) at `step` (default: the one step both hold); stdout's text
/// and the exit code (0 same, 1 a difference or unmatched rows).
///
/// Errors: not two paths, an unknown or mixed layout, a step missing or ambiguous, a file
/// unreadable (each naming the file) — exit 2.
pub fn run(
    dumps: &[PathBuf],
    mapping: Option<&Path>,
    step: Option<i64>,
    atol: Option<f64>,
    rtol: Option<f64>,
    format: Format,
    quiet: bool,
) -> Result<(String, u8), Error> {
    let [a, b] = dumps else {
        return Err(Error::Usage(
            "give two dumps to compare: dumpdiff A B --step N".into(),
        ));
    };
    let mapping = mapping.map(Mapping::load).transpose()?;
    let reader = |p: &Path| -> Result<&dyn StepReader, Error> {
        match &mapping {
            Some(m) if m.detect(p) => Ok(m),
            _ => step_reader_for(p),
        }
    };
    let (ra, rb) = (reader(a)?, reader(b)?);
    let step = match step {
        Some(s) => s,
        None => {
            let sa = ra.steps(a)?;
            let sb = rb.steps(b)?;
            let common: Vec<i64> = sa.iter().copied().filter(|s| sb.contains(s)).collect();
            match common.as_slice() {
                [one] => *one,
                _ => {
                    return Err(Error::Usage(format!(
                        "--step N is required ({} holds steps {sa:?}, {} holds {sb:?})",
                        a.display(),
                        b.display()
                    )))
                }
            }
        }
    };
    let (da, db) = (ra.read_step(a, step)?, rb.read_step(b, step)?);
    let closeness = Closeness {
        atol: atol.unwrap_or(0.0),
        rtol: rtol.unwrap_or(0.0),
    };
    let report = compare(&da, &db, closeness);
    let text = match (quiet, format) {
        (true, _) => String::new(),
        (false, Format::Json) => {
            serde_json::to_string_pretty(&report).map_err(Error::internal)? + "\n"
        }
        (false, _) => report.to_text(),
    };
    Ok((
        text,
        if report.clean() {
            EXIT_CLEAN
        } else {
            EXIT_FOUND
        },
    ))
}
