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

#[test]
fn areal_rollout_jsonl_rows_with_versions_and_no_log_probs() {
    let roles = check_tree("areal");
    assert!(roles.is_empty());
    let root = stacks().join("areal");
    let d = step_reader_for(&root).unwrap().read_step(&root, 3).unwrap();
    let rows = &d.cells[0].batch.rows;
    assert_eq!(rows.len(), 4);
    // Row 3 (task 1, sample 1) was generated partly by version 2: its staleness.
    assert_eq!(rows[3].version, Some(2));
    assert_eq!(rows[3].sample.as_deref(), Some("1/1"));
    assert_eq!(rows[3].group.as_deref(), Some("1"));
    assert!(d.unplaced.iter().any(|u| u.ends_with(": completion")));
}

fn read(tree: &str) -> StepDump {
    let root = stacks().join(tree);
    step_reader_for(&root).unwrap().read_step(&root, 3).unwrap()
}

#[test]
fn the_same_step_in_two_stacks_layouts_compares_clean() {
    use rlforensics::dumpdiff::model_compare::{compare, Closeness};
    for (a, b, roles) in [
        ("verl", "nemo_rl", 2),
        ("verl", "slime", 3),
        ("nemo_rl", "slime", 2),
        ("slime", "sglang_dumper", 3),
        ("verl_numpy", "verl", 3),
        ("miles", "verl_rollout_skip", 1),
    ] {
        let r = compare(&read(a), &read(b), Closeness::default());
        assert!(r.clean(), "{a} vs {b}:\n{}", r.to_text());
        assert_eq!(r.rows_matched, 4, "{a} vs {b}");
        let lp = r
            .quantities
            .iter()
            .filter(|q| q.quantity.starts_with("log_probs"))
            .count();
        assert_eq!(lp, roles, "{a} vs {b}:\n{}", r.to_text());
        // Every response token of every row was compared for each shared role.
        let old = r
            .quantities
            .iter()
            .find(|q| q.quantity == "log_probs[rollout]")
            .unwrap();
        assert_eq!(old.compared, 4 + 6 + 2 + 5, "{a} vs {b}");
    }
}

#[test]
fn a_planted_difference_is_found_at_its_rank_row_and_position() {
    use rlforensics::dumpdiff::model_compare::{compare, Closeness};
    let m = manifest();
    let p = &m["trees"]["nemo_rl_planted"]["planted"];
    // verl (whole batch) against the planted NeMo-RL tree: row 2, response token 1.
    let r = compare(
        &read("verl"),
        &read("nemo_rl_planted"),
        Closeness::default(),
    );
    let d = r.first_difference.clone().expect("the planted difference");
    assert_eq!(d.quantity, "log_probs[old]");
    assert_eq!((d.a.rank, d.a.row), (0, 2));
    assert_eq!((d.b.rank, d.b.row), (0, 2));
    assert_eq!(d.position, Some(1));
    assert_eq!(d.b_value, p["value"].as_f64().unwrap());
    assert_eq!(d.a_value, p["was"].as_f64().unwrap());
    let q = r
        .quantities
        .iter()
        .find(|q| q.quantity == "log_probs[old]")
        .unwrap();
    assert_eq!(q.differing, 1);
    assert!(!r.clean());
    assert!(
        r.to_text().contains(
            "FIRST DIFFERENCE: log_probs[old] at A rank 0 row 2 / B rank 0 row 2, response token 1"
        ),
        "{}",
        r.to_text()
    );
    // Against slime, whose DP rank 0 holds rows 0 and 2: found at rank 0 row 1 there.
    let r = compare(
        &read("nemo_rl_planted"),
        &read("slime"),
        Closeness::default(),
    );
    let d = r.first_difference.unwrap();
    assert_eq!(
        (d.a.rank, d.a.row, d.b.rank, d.b.row, d.position),
        (0, 2, 0, 1, Some(1))
    );
    // A tolerance wider than the planted 0.01 makes it clean.
    let r = compare(
        &read("verl"),
        &read("nemo_rl_planted"),
        Closeness {
            atol: 0.02,
            rtol: 0.0,
        },
    );
    assert!(r.clean(), "{}", r.to_text());
}

#[test]
fn rows_without_token_ids_are_counted_not_matched() {
    use rlforensics::dumpdiff::model_compare::{compare, Closeness};
    let r = compare(&read("verl"), &read("areal"), Closeness::default());
    assert_eq!(r.rows_matched, 0);
    assert_eq!(r.rows_without_tokens, 4);
    assert!(!r.clean());
}

fn dumpdiff(args: &[&str]) -> (String, String, i32) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dumpdiff"))
        .args(args)
        .current_dir(stacks())
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code().unwrap(),
    )
}

#[test]
fn dumpdiff_positional_a_b_detects_producers_and_sets_the_exit_code() {
    let (out, _, code) = dumpdiff(&["verl", "slime", "--step", "3"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("A = verl") && out.contains("B = slime") && out.contains("SAME"),
        "{out}"
    );
    // The step defaults to the one step both hold.
    let (out, _, code) = dumpdiff(&["verl", "nemo_rl_planted"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "FIRST DIFFERENCE: log_probs[old] at A rank 0 row 2 / B rank 0 row 2, response token 1"
        ),
        "{out}"
    );
    let (out, _, code) = dumpdiff(&["verl", "nemo_rl_planted", "--format", "json"]);
    assert_eq!(code, 1);
    let j: J = serde_json::from_str(&out).unwrap();
    assert_eq!(j["first_difference"]["position"], 1);
    assert_eq!(j["first_difference"]["b"]["row"], 2);
    // A tree of several producers is refused with the list; exit 2.
    let (_, err, code) = dumpdiff(&[".", "verl"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("several producers") && err.contains("verl") && err.contains("nemo-rl"),
        "{err}"
    );
    // A folder no producer recognises: exit 2 naming it and the producers known.
    let (_, err, code) = dumpdiff(&["../kernels", "verl"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("kernels") && err.contains("no known producer"),
        "{err}"
    );
    // An in-house layout through a mapping file (here the SGLang dumper's, as a mapping).
    let (out, _, code) = dumpdiff(&[
        "sglang_dumper",
        "verl",
        "--mapping",
        "mappings/sglang_dumper.toml",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("A = sglang-dumper") && out.contains("SAME"),
        "{out}"
    );
    // A missing step names the steps there are.
    let (_, err, code) = dumpdiff(&["verl", "slime", "--step", "9"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("step 9") && err.contains("[3]"), "{err}");
}

#[test]
fn dumpdiff_inspect_names_producer_steps_ranks_and_roles() {
    let (out, err, code) = dumpdiff(&["--inspect", "slime"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(producer: slime)"), "{out}");
    assert!(
        out.contains("step 3: ranks {0, 1}, 2 cells")
            && out.contains("roles [rollout, old, reference]"),
        "{out}"
    );
    let (out, _, code) = dumpdiff(&["--inspect", "verl_numpy/batch_step3.pkl"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("(producer: verl)") && out.contains("step 3: ranks {0}"),
        "{out}"
    );
    let (out, _, code) = dumpdiff(&["--inspect", "nemo_rl"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("(producer: nemo-rl)") && out.contains("roles [rollout, old]"),
        "{out}"
    );
}

#[test]
fn a_mapping_file_reproduces_the_sglang_dumper_producer_exactly() {
    use rlforensics::producers::mapping::Mapping;
    use rlforensics::producers::StepReader;
    let m = Mapping::load(&stacks().join("mappings/sglang_dumper.toml")).unwrap();
    let root = stacks().join("sglang_dumper");
    assert!(m.detect(&root));
    assert_eq!(m.steps(&root).unwrap(), vec![3]);
    let via_map = m.read_step(&root, 3).unwrap();
    let built_in = read("sglang_dumper");
    assert_eq!(via_map.producer, built_in.producer);
    assert_eq!(via_map.cells.len(), built_in.cells.len());
    for (x, y) in via_map.cells.iter().zip(&built_in.cells) {
        assert_eq!((x.rank, x.micro), (y.rank, y.micro));
        let mut fx = x.files.clone();
        let mut fy = y.files.clone();
        fx.sort();
        fy.sort();
        assert_eq!(fx, fy);
        let (bx, by) = (&x.batch, &y.batch);
        assert_eq!(bx.positions, by.positions);
        assert_eq!(
            bx.log_probs.keys().collect::<Vec<_>>(),
            by.log_probs.keys().collect::<Vec<_>>()
        );
        let pairs = bx.log_probs.values().zip(by.log_probs.values()).chain([
            (
                bx.input_ids.as_ref().unwrap(),
                by.input_ids.as_ref().unwrap(),
            ),
            (
                bx.response_ids.as_ref().unwrap(),
                by.response_ids.as_ref().unwrap(),
            ),
            (
                bx.response_mask.as_ref().unwrap(),
                by.response_mask.as_ref().unwrap(),
            ),
            (
                bx.advantages.as_ref().unwrap(),
                by.advantages.as_ref().unwrap(),
            ),
        ]);
        for (tx, ty) in pairs {
            assert_eq!(tx.tensor.shape(), ty.tensor.shape());
            assert_eq!(tx.dtype, ty.dtype);
            assert_eq!(tx.tensor.element_bytes(), ty.tensor.element_bytes());
            assert_eq!(tx.source, ty.source);
        }
        assert!(bx.entropy.is_none() && by.entropy.is_none());
    }
    let r = rlforensics::dumpdiff::model_compare::compare(&via_map, &built_in, Default::default());
    assert!(r.clean(), "{}", r.to_text());
}

#[test]
fn a_mapping_names_a_wrong_dtype_and_a_bad_field_with_the_file() {
    use rlforensics::producers::mapping::Mapping;
    use rlforensics::producers::StepReader;
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(stacks().join("mappings/sglang_dumper.toml")).unwrap();
    let p = dir.path().join("m.toml");
    std::fs::write(
        &p,
        text.replacen("dtype = \"float32\"", "dtype = \"bfloat16\"", 1),
    )
    .unwrap();
    let e = Mapping::load(&p)
        .unwrap()
        .read_step(&stacks().join("sglang_dumper"), 3)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("rollout_log_probs")
            && e.contains("stored as float32")
            && e.contains("bfloat16"),
        "{e}"
    );
    std::fs::write(
        &p,
        text.replacen("field = \"advantages\"", "field = \"advantage\"", 1),
    )
    .unwrap();
    let e = Mapping::load(&p).err().unwrap().to_string();
    assert!(e.contains("m.toml") && e.contains("advantage"), "{e}");
    std::fs::write(&p, text.replacen("{rank}", "{rnak}", 1)).unwrap();
    let e = Mapping::load(&p).err().unwrap().to_string();
    assert!(e.contains("unknown placeholder {rnak}"), "{e}");
}
