//! Every stack's dumps in the one model (issue 29): one GRPO step written in each
//! producer's layout by fixtures/gen/make_stacks.py (verl's own `DataProto` where it
//! installs), read through `StepReader` and checked value by value against the
//! generator's manifest.

use std::path::{Path, PathBuf};

use rlforensics::model::step::{LogProbSource, StepDump, TokenPositions, TokenTensor};
use rlforensics::producers::{step_reader_for, step_readers};
use serde_json::Value as J;

fn stacks() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/stacks")
}

fn manifest() -> J {
    let text = std::fs::read_to_string(stacks().join("manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &J) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Row `i`'s `n` values of `t` for the tokens of the response, whatever the columns
/// mean: response columns start at 0, sequence columns at the prompt length.
fn response_values(
    _d: &StepDump,
    b: &rlforensics::model::step::TokenBatch,
    t: &TokenTensor,
    i: usize,
    prompt_len: usize,
    n: usize,
) -> Vec<f64> {
    let shape = t.tensor.shape();
    let w = shape[1];
    let all = t.tensor.to_f64_vec();
    let start = match b.positions {
        TokenPositions::Response => 0,
        TokenPositions::Sequence => prompt_len,
    };
    all[i * w + start..i * w + start + n].to_vec()
}

/// The group id a tree writes for row `r`: verl's `uid` text, slime's `group_index`.
fn group_of(spec: &J, r: &J) -> String {
    match spec.get("group_field").and_then(J::as_str) {
        Some("group") => r["group"].to_string(),
        _ => r["uid"].as_str().unwrap().to_string(),
    }
}

/// Check every dumped quantity of `tree` against the manifest's rows; returns the roles
/// found.
fn check_tree(tree: &str) -> Vec<LogProbSource> {
    let m = manifest();
    let spec = &m["trees"][tree];
    let root = stacks().join(tree);
    let reader = step_reader_for(&root).unwrap();
    assert_eq!(reader.name(), spec["producer"].as_str().unwrap(), "{tree}");
    let step = spec["step"].as_i64().unwrap();
    assert_eq!(reader.steps(&root).unwrap(), vec![step], "{tree}");
    let d = reader.read_step(&root, step).unwrap();
    assert_eq!(d.step, step);
    let ranks: Vec<usize> = d.cells.iter().map(|c| c.rank).collect();
    let want_ranks: Vec<usize> = spec["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(ranks, want_ranks, "{tree}");
    let all_rows = m["rows"].as_array().unwrap();
    for (ci, cell) in d.cells.iter().enumerate() {
        let b = &cell.batch;
        let order: Vec<usize> = match spec.get("rank_rows") {
            Some(rr) => rr[cell.rank.to_string()]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect(),
            None => (0..all_rows.len()).collect(),
        };
        for (i, &gi) in order.iter().enumerate() {
            let r = &all_rows[gi];
            let pl = r["prompt"].as_array().unwrap().len();
            let rl = r["response"].as_array().unwrap().len();
            for (role, key) in [
                (LogProbSource::Rollout, "rollout"),
                (LogProbSource::Old, "old"),
                (LogProbSource::Reference, "ref"),
            ] {
                if let Some(t) = b.log_probs(role) {
                    assert_eq!(
                        response_values(&d, b, t, i, pl, rl),
                        floats(&r[key]),
                        "{tree} row {i} {key}"
                    );
                }
            }
            if let Some(t) = &b.entropy {
                assert_eq!(
                    response_values(&d, b, t, i, pl, rl),
                    floats(&r["entropy"]),
                    "{tree} row {i} entropy"
                );
            }
            if let Some(t) = &b.response_ids {
                assert_eq!(
                    response_values(&d, b, t, i, pl, rl),
                    floats(&r["response"]),
                    "{tree} row {i} responses"
                );
            }
            if let Some(t) = &b.advantages {
                let a = r["advantage"].as_f64().unwrap();
                assert_eq!(
                    response_values(&d, b, t, i, pl, rl),
                    vec![a; rl],
                    "{tree} row {i} advantages"
                );
            }
            if let Some(t) = &b.response_mask {
                assert_eq!(
                    response_values(&d, b, t, i, pl, rl),
                    vec![1.0; rl],
                    "{tree} row {i} mask"
                );
            }
            if let Some(meta) = b.rows.get(i) {
                if let Some(g) = &meta.group {
                    assert_eq!(g, &group_of(spec, r), "{tree} row {i} group");
                }
                if let Some(x) = meta.reward {
                    assert_eq!(x, r["reward"].as_f64().unwrap(), "{tree} row {i} reward");
                }
                if let Some(x) = meta.prompt_len {
                    assert_eq!(x, pl, "{tree} row {i} prompt length");
                }
                if let Some(x) = meta.response_len {
                    assert_eq!(x, rl, "{tree} row {i} response length");
                }
            }
        }
        let _ = ci;
    }
    let roles = d.roles();
    let want: Vec<String> = spec["roles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect();
    let got: Vec<String> = roles
        .iter()
        .map(|r| {
            serde_json::to_value(r)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(got, want, "{tree} roles");
    roles
}

#[test]
fn verl_torch_serialization_read_against_the_manifest() {
    check_tree("verl");
    let root = stacks().join("verl");
    let d = step_reader_for(&root).unwrap().read_step(&root, 3).unwrap();
    let b = &d.cells[0].batch;
    assert_eq!(b.positions, TokenPositions::Response);
    assert_eq!(b.rows.len(), 4);
    assert!(b.input_ids.is_some() && b.attention_mask.is_some() && b.token_rewards.is_some());
    // TIS weights exp(old - rollout) truncated at 2, as the generator computed them.
    let m = manifest();
    let w = b.importance_weights.as_ref().unwrap().tensor.to_f64_vec();
    let r0 = &m["rows"][0];
    let (old, eng) = (floats(&r0["old"]), floats(&r0["rollout"]));
    for t in 0..old.len() {
        let want = ((old[t] as f32 - eng[t] as f32).exp()).min(2.0) as f64;
        assert!(
            (w[t] - want).abs() <= 1e-6 * want.abs(),
            "weight {t}: {} vs {want}",
            w[t]
        );
    }
    // prompts / position_ids / returns are not in the model: listed, never silent.
    for k in ["batch.prompts", "batch.position_ids", "batch.returns"] {
        assert!(
            d.unplaced.iter().any(|u| u.ends_with(k)),
            "{k} not listed in {:?}",
            d.unplaced
        );
    }
}

#[test]
fn verl_numpy_serialization_reads_the_same_values() {
    check_tree("verl_numpy");
}

#[test]
fn verl_rollout_skip_gen_batch_step_from_meta_info() {
    let roles = check_tree("verl_rollout_skip");
    assert_eq!(roles, vec![LogProbSource::Rollout]);
}

#[test]
fn every_step_reader_is_registered_once() {
    let names: Vec<&str> = step_readers().iter().map(|r| r.name()).collect();
    let mut dedup = names.clone();
    dedup.sort_unstable();
    dedup.dedup();
    assert_eq!(names.len(), dedup.len(), "{names:?}");
    assert!(names.contains(&"verl"));
}

#[test]
fn an_unknown_tree_is_refused_naming_what_was_expected() {
    let e = step_reader_for(&stacks().join("../tolerances.toml"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("tolerances.toml") && e.contains("no known producer") && e.contains("verl"),
        "{e}"
    );
}

#[test]
fn a_truncated_dataproto_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(stacks().join("verl/step_3/batch.dp")).unwrap();
    let p = dir.path().join("batch_step3.dp");
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let r = step_reader_for(dir.path()).unwrap();
    assert_eq!(r.name(), "verl");
    let e = r.read_step(dir.path(), 3).err().unwrap().to_string();
    assert!(e.contains("batch_step3.dp") && e.contains("pickle"), "{e}");
}

#[test]
fn nemo_rl_train_data_jsonl_read_against_the_manifest() {
    let roles = check_tree("nemo_rl");
    assert_eq!(roles, vec![LogProbSource::Rollout, LogProbSource::Old]);
    let root = stacks().join("nemo_rl");
    let d = step_reader_for(&root).unwrap().read_step(&root, 3).unwrap();
    let b = &d.cells[0].batch;
    assert_eq!(b.positions, TokenPositions::Sequence);
    // Prompt positions hold 0 (NeMo-RL's convention), token ids are prompt ++ response.
    let m = manifest();
    let r1 = &m["rows"][1];
    let pl = r1["prompt"].as_array().unwrap().len();
    let w = b.input_ids.as_ref().unwrap().tensor.shape()[1];
    let ids = b.input_ids.as_ref().unwrap().tensor.to_f64_vec();
    let want: Vec<f64> = floats(&r1["prompt"])
        .into_iter()
        .chain(floats(&r1["response"]))
        .collect();
    assert_eq!(&ids[w..w + want.len()], &want[..]);
    let old = b.log_probs(LogProbSource::Old).unwrap().tensor.to_f64_vec();
    assert!(old[w..w + pl].iter().all(|&x| x == 0.0));
    assert_eq!(b.rows[1].sample.as_deref(), Some("1"));
    assert!(
        d.unplaced.iter().any(|u| u.ends_with(": content")),
        "{:?}",
        d.unplaced
    );
}

#[test]
fn a_nemo_rl_line_without_its_length_1_list_names_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let text =
        std::fs::read_to_string(stacks().join("nemo_rl/exp_001/train_data_step3.jsonl")).unwrap();
    let bad = text.replacen("\"rewards\": [1.0]", "\"rewards\": 1.0", 1);
    assert_ne!(bad, text);
    std::fs::write(dir.path().join("train_data_step3.jsonl"), bad).unwrap();
    let r = step_reader_for(dir.path()).unwrap();
    let e = r.read_step(dir.path(), 3).err().unwrap().to_string();
    assert!(
        e.contains("train_data_step3.jsonl") && e.contains("line 1") && e.contains("rewards"),
        "{e}"
    );
    let e = r.read_step(dir.path(), 4).err().unwrap().to_string();
    assert!(e.contains("steps there: [3]"), "{e}");
}

#[test]
fn slime_train_dump_one_cell_per_dp_rank_with_the_rollout_dumps_groups() {
    check_tree("slime");
    let root = stacks().join("slime");
    let d = step_reader_for(&root).unwrap().read_step(&root, 3).unwrap();
    assert_eq!(d.cells.len(), 2);
    let m = manifest();
    // rank 1 holds rows 1 and 3: groups and weight versions come from the rollout dump.
    let b = &d.cells[1].batch;
    assert_eq!(b.rows[1].group.as_deref(), Some("1"));
    assert_eq!(b.rows[1].version, Some(6));
    assert_eq!(b.rows[1].sample.as_deref(), Some("3"));
    assert_eq!(
        b.log_probs(LogProbSource::Old).unwrap().dtype,
        Some(rlforensics::DType::F32)
    );
    assert_eq!(m["rows"][3]["group"].as_i64(), Some(1));
    assert!(
        d.unplaced.iter().any(|u| u.ends_with("raw_reward")),
        "{:?}",
        d.unplaced
    );
}

#[test]
fn miles_rollout_dump_with_status_and_specinfo_objects() {
    let roles = check_tree("miles");
    assert_eq!(roles, vec![LogProbSource::Rollout]);
    let root = stacks().join("miles");
    let d = step_reader_for(&root).unwrap().read_step(&root, 3).unwrap();
    // spec_info (a Sample.SpecInfo object) is not in the model: listed.
    assert!(
        d.unplaced
            .iter()
            .any(|u| u.ends_with("samples[].spec_info")),
        "{:?}",
        d.unplaced
    );
}

#[test]
fn getattr_is_refused_unless_it_names_a_data_class_nested_class() {
    use rlforensics::formats::pt::pickle::unpickle;
    // getattr(torch.Tensor, "add") — never accepted.
    let evil = b"\x80\x02c__builtin__\ngetattr\nctorch\nTensor\nX\x03\x00\x00\x00add\x86R.";
    let e = unpickle(evil, "data.pkl", &mut |_| Err("none".into()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("getattr") || e.contains("nested class"), "{e}");
    // getattr(slime Sample, "Status")("completed") — data.
    let ok = b"\x80\x02c__builtin__\ngetattr\ncslime.utils.types\nSample\nX\x06\x00\x00\x00Status\x86RX\x09\x00\x00\x00completed\x85R.";
    let v = unpickle(ok, "data.pkl", &mut |_| Err("none".into())).unwrap();
    assert_eq!(
        v.get("__class__").and_then(|x| x.as_str()),
        Some("slime.utils.types.Sample.Status")
    );
    // getattr(Sample, "Evil") — a name not in the list.
    let bad =
        b"\x80\x02c__builtin__\ngetattr\ncslime.utils.types\nSample\nX\x04\x00\x00\x00Evil\x86R.";
    assert!(unpickle(bad, "data.pkl", &mut |_| Err("none".into())).is_err());
}

#[test]
fn sglang_dumper_files_one_cell_per_rank() {
    check_tree("sglang_dumper");
    let root = stacks().join("sglang_dumper");
    let d = step_reader_for(&root).unwrap().read_step(&root, 3).unwrap();
    assert_eq!(d.cells.len(), 2);
    assert!(d
        .cells
        .iter()
        .all(|c| c.micro.is_none() && c.files.len() == 7));
    let t = d.cells[1].batch.log_probs(LogProbSource::Old).unwrap();
    assert!(t
        .source
        .file
        .to_string_lossy()
        .contains("rank=1___dump_index=5___name=old_log_probs"));
}
