//! Metamorphic checks on committed real-convention scenarios (issue 28, session 22;
//! fixtures/gen/perturb_scenarios.py runs them all): a change to a dump that does not
//! change the step's numbers must not change a verdict.

use std::path::Path;

use serde_json::Value as Json;

use crate::support::{copy_tree, losscheck_json};

/// Every jsonl forward_data file of `tree` with `log_probs` and `entropy` replaced by
/// values no 16-bit dtype holds wherever `response_mask` is 0; the number replaced.
fn garbage_outside_the_mask(tree: &Path) -> usize {
    let mut n = 0;
    for f in std::fs::read_dir(tree.join("forward_data")).unwrap() {
        let f = f.unwrap().path();
        let mut v: Json = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        let mask = v["response_mask"].clone();
        for (key, junk) in [("log_probs", -7.123456789), ("entropy", 2.345678901)] {
            for (row, mrow) in v[key]
                .as_array_mut()
                .unwrap()
                .iter_mut()
                .zip(mask.as_array().unwrap())
            {
                for (x, m) in row
                    .as_array_mut()
                    .unwrap()
                    .iter_mut()
                    .zip(mrow.as_array().unwrap())
                {
                    if m.as_f64() == Some(0.0) {
                        *x = junk.into();
                        n += 1;
                    }
                }
            }
        }
        std::fs::write(&f, serde_json::to_string(&v).unwrap() + "\n").unwrap();
    }
    n
}

fn statuses(r: &Json) -> Vec<(String, String)> {
    r["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["file"].as_str().unwrap().to_string(),
                v["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn garbage_outside_the_mask_of_a_jsonl_dump_changes_no_losscheck_verdict() {
    // seeds 7029 and 7435: a jsonl dump states no dtype, so the self-hosted log-probs'
    // and entropy's dtype was read off every value, padding included: f64 junk at masked
    // positions made bf16 values "f64", the rounding allowance shrank to nothing and a
    // clean cell became inconsistent (7029) or the entropy's token-mean went unseen (7435)
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/scenarios");
    for name in ["real-novel-jsonl-bf16-7029", "real-novel-agg-zero-adv-7435"] {
        let src = root.join(name).join("self_hosted_pt");
        let (code, base) = losscheck_json(&src);
        let dir = tempfile::tempdir().unwrap();
        copy_tree(&src, dir.path());
        assert!(
            garbage_outside_the_mask(dir.path()) > 0,
            "{name}: no masked position"
        );
        let (code2, perturbed) = losscheck_json(dir.path());
        assert_eq!(code2, code, "{name}");
        let rel = |v: Vec<(String, String)>| -> Vec<(String, String)> {
            v.into_iter()
                .map(|(f, s)| (f.rsplit('/').take(2).collect::<Vec<_>>().join("/"), s))
                .collect()
        };
        assert_eq!(rel(statuses(&perturbed)), rel(statuses(&base)), "{name}");
    }
}

/// Every (section, rank, micro) cell verdict of a dumpdiff report.
fn cell_verdicts(r: &Json) -> Vec<(String, Option<u64>, Option<u64>, String)> {
    let mut out = Vec::new();
    for s in r["sections"].as_array().unwrap() {
        for c in s["cells"].as_array().unwrap() {
            out.push((
                s["name"].as_str().unwrap().to_string(),
                c["rank"].as_u64(),
                c["micro"].as_u64(),
                c["verdict"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

#[test]
fn garbage_outside_the_mask_of_a_jsonl_dump_changes_no_dumpdiff_verdict() {
    // seed 7023: bf16 self-hosted log-probs in a jsonl dump beside the weaver's f32 ones;
    // f64 junk at masked positions made the pair's precision f32, so every forward_data
    // cell failed on the bf16 rounding (the precision is now read under response_mask);
    // seed 9013: the same in NexRL's right-padded layout, whose rows are moved left to
    // the weaver's (the moved values kept the precision read before the move)
    for name in [
        "real-novel-finer-logprobs-7023",
        "real-novel-kl-one-cell-9013",
    ] {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/scenarios")
            .join(name);
        let (code, base) = crate::real_weights::dumpdiff(&src);
        let dir = tempfile::tempdir().unwrap();
        for tree in ["self_hosted_pt", "weaver_pt", "remote_api_pt"] {
            if src.join(tree).is_dir() {
                copy_tree(&src.join(tree), &dir.path().join(tree));
            }
        }
        assert!(garbage_outside_the_mask(&dir.path().join("self_hosted_pt")) > 0);
        let (code2, perturbed) = crate::real_weights::dumpdiff(dir.path());
        assert_eq!(code2, code, "{name}");
        assert_eq!(cell_verdicts(&perturbed), cell_verdicts(&base), "{name}");
    }
}
