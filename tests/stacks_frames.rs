//! `dumpdiff --inspect STACK --export-frames DIR` on every whole-step producer's fixture
//! (fixtures/stacks, written by the producers' own code where they install): the tokens
//! frame holds each row's log-probs by role, in the model's names, equal to the
//! generator's manifest value for value; the trajectories frame its rewards.

use std::path::Path;

use assert_cmd::Command;
use polars::prelude::{DataFrame, ParquetReader, SerReader};
use serde_json::Value as Json;

fn stacks() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/stacks")
}

fn frame(dir: &Path, name: &str) -> DataFrame {
    let file = std::fs::File::open(dir.join(format!("{name}.parquet"))).unwrap();
    ParquetReader::new(file).finish().unwrap()
}

fn col(df: &DataFrame, name: &str) -> Vec<Option<f64>> {
    let c = df
        .column(name)
        .unwrap_or_else(|_| panic!("no column {name}"));
    let c = c.cast(&polars::prelude::DataType::Float64).unwrap();
    c.f64().unwrap().iter().collect()
}

#[test]
fn every_stack_exports_its_rows_log_probs_by_role() {
    let manifest: Json =
        serde_json::from_str(&std::fs::read_to_string(stacks().join("manifest.json")).unwrap())
            .unwrap();
    let rows = manifest["rows"].as_array().unwrap();
    let roles = [
        ("rollout", "log_probs_rollout"),
        ("old", "log_probs_old"),
        ("ref", "log_probs_reference"),
    ];
    for tree in ["verl", "verl_numpy", "nemo_rl", "slime", "sglang_dumper"] {
        let m = &manifest["trees"][tree];
        let out = tempfile::tempdir().unwrap();
        Command::cargo_bin("dumpdiff")
            .unwrap()
            .arg("--inspect")
            .arg(stacks().join(tree))
            .arg("--export-frames")
            .arg(out.path())
            .assert()
            .code(0);
        let t = frame(out.path(), "tokens");
        let (rank, row, mask) = (col(&t, "rank"), col(&t, "row"), col(&t, "response_mask"));
        let want_roles: Vec<&str> = m["roles"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        let mut checked = 0;
        for (role, column) in roles {
            let model_role = if role == "ref" { "reference" } else { role };
            if !want_roles.contains(&model_role) {
                assert!(t.column(column).is_err(), "{tree}: {column} not dumped");
                continue;
            }
            let values = col(&t, column);
            // (rank, row) → the manifest row: per-rank lists where the tree splits them
            let manifest_row = |r: usize, i: usize| -> usize {
                match m.get("rank_rows") {
                    Some(rr) => rr[r.to_string()][i].as_u64().unwrap() as usize,
                    None => i,
                }
            };
            for (r, i) in [(0usize, 0usize), (0, 1)]
                .into_iter()
                .chain(m.get("rank_rows").map(|_| (1usize, 0usize)))
            {
                let got: Vec<f64> = (0..t.height())
                    .filter(|&k| {
                        rank[k] == Some(r as f64)
                            && row[k] == Some(i as f64)
                            && mask[k] == Some(1.0)
                    })
                    .map(|k| values[k].unwrap())
                    .collect();
                let want: Vec<f64> = rows[manifest_row(r, i)][role]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect();
                assert_eq!(got.len(), want.len(), "{tree} {column} rank {r} row {i}");
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(*g as f32, *w as f32, "{tree} {column} rank {r} row {i}");
                }
                checked += 1;
            }
        }
        assert!(checked >= 2, "{tree}");
        let traj = frame(out.path(), "trajectories");
        assert_eq!(traj.height(), rows.len(), "{tree}");
        if tree == "verl" {
            let rewards = col(&traj, "reward");
            for (i, r) in rows.iter().enumerate() {
                assert_eq!(rewards[i], r["reward"].as_f64(), "verl reward of row {i}");
            }
        }
    }
}

/// The text column `name` of `df`, nulls as `None`.
fn text(df: &DataFrame, name: &str) -> Vec<Option<String>> {
    df.column(name)
        .unwrap()
        .str()
        .unwrap()
        .iter()
        .map(|s| s.map(str::to_string))
        .collect()
}

#[test]
fn the_decoded_text_a_stack_dumps_is_in_the_trajectories_frame() {
    // make_stacks.py writes row k's text as `prompt k` / `response k` (verl's generations
    // add ` é`, a non-ASCII character kept as written); NeMo-RL's jsonl holds no text
    for tree in ["areal", "slime", "miles", "verl_generations", "nemo_rl"] {
        let out = tempfile::tempdir().unwrap();
        Command::cargo_bin("dumpdiff")
            .unwrap()
            .arg("--inspect")
            .arg(stacks().join(tree))
            .arg("--export-frames")
            .arg(out.path())
            .assert()
            .code(0);
        let traj = frame(out.path(), "trajectories");
        let (prompts, responses) = (text(&traj, "prompt"), text(&traj, "response"));
        assert_eq!(prompts.len(), 4, "{tree}");
        if tree == "nemo_rl" {
            assert!(prompts.iter().chain(&responses).all(Option::is_none));
            continue;
        }
        let suffix = if tree == "verl_generations" {
            " é"
        } else {
            ""
        };
        let mut seen: Vec<String> = prompts
            .iter()
            .zip(&responses)
            .map(|(p, r)| {
                let p = p
                    .clone()
                    .unwrap_or_else(|| panic!("{tree}: a row without its prompt"));
                let k = p.strip_prefix("prompt ").unwrap().to_string();
                assert_eq!(
                    r.as_deref(),
                    Some(format!("response {k}{suffix}").as_str()),
                    "{tree}"
                );
                k
            })
            .collect();
        seen.sort();
        assert_eq!(seen, ["0", "1", "2", "3"], "{tree}");
    }
}

#[test]
fn trls_completion_logs_are_read_into_the_model_as_text_rows() {
    // fixtures/completions/trl_garbled: written by TRL 1.16's own GRPOTrainer on CPU
    // (make_completions.py). Each completions_{step:05d}.parquet row becomes a model row:
    // the reward functions' columns summed, the advantage, the messages' text.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/completions/trl_garbled");
    let out = tempfile::tempdir().unwrap();
    let inspect = Command::cargo_bin("dumpdiff")
        .unwrap()
        .arg("--inspect")
        .arg(&root)
        .arg("--export-frames")
        .arg(out.path())
        .output()
        .unwrap();
    assert_eq!(inspect.status.code(), Some(0));
    let text_out = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        text_out.contains("(producer: trl)") && text_out.contains("steps: [1, 2, 3]"),
        "{text_out}"
    );
    let traj = frame(out.path(), "trajectories");
    let (step, reward, adv) = (
        col(&traj, "step"),
        col(&traj, "reward"),
        col(&traj, "advantage"),
    );
    let (prompts, responses) = (text(&traj, "prompt"), text(&traj, "response"));
    let mut k = 0;
    for s in 1..=3 {
        let f = std::fs::File::open(root.join(format!("completions/completions_{s:05}.parquet")))
            .unwrap();
        let df = ParquetReader::new(f).finish().unwrap();
        let len = col(&df, "reward_len");
        let fmt = col(&df, "reward_format");
        let a = col(&df, "advantage");
        let content = |name: &str, i: usize| -> String {
            // a list of {role, content} messages: the content
            let v = df.column(name).unwrap().get(i).unwrap().to_string();
            v.split("\"content\": ")
                .nth(1)
                .map(str::to_string)
                .unwrap_or(v)
        };
        for i in 0..df.height() {
            assert_eq!(step[k], Some(s as f64));
            assert_eq!(
                reward[k],
                Some(len[i].unwrap() + fmt[i].unwrap()),
                "row {k}"
            );
            assert_eq!(adv[k], a[i], "row {k}");
            let p = prompts[k].clone().unwrap();
            assert!(
                content("prompt", i).contains(&p),
                "{p:?} vs {}",
                content("prompt", i)
            );
            assert!(responses[k].is_some());
            k += 1;
        }
    }
    assert_eq!(k, traj.height());
}
