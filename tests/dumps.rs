//! Dump trees written by real `torch.save` / `json.dumps` (fixtures/gen/make_dumps.py):
//! discovery, every tensor and scalar against the generator's manifest, and frames that are
//! identical whether a dump was written as `.pt` or `.jsonl`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use polars::prelude::{AnyValue, ChunkCompareEq, DataFrame};
use rlforensics::formats::{read_any, FileFormat};
use rlforensics::frames::{build_frames, tokens_hash};
use rlforensics::producers::layout::{DumpTree, Kind, Producer};
use rlforensics::{DType, Value};
use serde_json::Value as J;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/dumps")
}

fn manifest() -> J {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/expected/manifest.json"),
    )
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The manifest writes floats as Python reprs ('nan', 'inf', '-inf' included).
fn num(v: &J) -> Option<f64> {
    match v {
        J::Number(n) => n.as_f64(),
        J::String(s) => s.parse::<f64>().ok(),
        J::Bool(b) => Some(*b as u8 as f64),
        _ => None,
    }
}

fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

fn manifest_files(m: &J, tree: &str) -> Vec<J> {
    m["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["tree"] == tree)
        .cloned()
        .collect()
}

/// (kind, format, step, rank, micro) of one dump file.
type Cell = (String, String, i64, Option<u32>, Option<u32>);

const TREES: [(&str, Producer); 7] = [
    ("self_hosted_pt", Producer::SelfHosted),
    ("self_hosted_jsonl", Producer::SelfHosted),
    ("remote_api_pt", Producer::RemoteApi),
    ("remote_api_jsonl", Producer::RemoteApi),
    ("weaver_pt", Producer::Weaver),
    ("weaver_jsonl", Producer::Weaver),
    ("weaver_faulty_pt", Producer::Weaver),
];

#[test]
fn discovery_places_every_generated_file() {
    let m = manifest();
    for (tree, producer) in TREES {
        let t = DumpTree::discover(&root().join(tree)).unwrap();
        assert_eq!(t.producer, producer, "{tree}");
        assert!(t.unrecognised.is_empty(), "{tree}: {:?}", t.unrecognised);
        let found: BTreeSet<Cell> = t
            .files()
            .iter()
            .map(|f| {
                let fmt = f.format.extension().to_string();
                (f.kind.dir_name().to_string(), fmt, f.step, f.rank, f.micro)
            })
            .collect();
        let expected: BTreeSet<_> = manifest_files(&m, tree)
            .iter()
            .map(|f| {
                (
                    f["kind"].as_str().unwrap().to_string(),
                    f["format"].as_str().unwrap().to_string(),
                    f["step"].as_i64().unwrap(),
                    f["rank"].as_u64().map(|r| r as u32),
                    f["micro"].as_u64().map(|r| r as u32),
                )
            })
            .collect();
        assert_eq!(found, expected, "{tree}");
    }
}

#[test]
fn ranks_sort_by_number_and_negative_steps_parse() {
    let t = DumpTree::discover(&root().join("self_hosted_pt")).unwrap();
    let ranks: Vec<u32> = t.ranks(Kind::ForwardData, 0).into_iter().collect();
    assert_eq!(ranks, (0..12).collect::<Vec<_>>());
    let order: Vec<u32> = t
        .files_of(Kind::ForwardData, 0)
        .filter_map(|f| f.rank)
        .collect();
    let pos2 = order.iter().position(|&r| r == 2).unwrap();
    let pos10 = order.iter().position(|&r| r == 10).unwrap();
    assert!(pos2 < pos10, "rank10 must come after rank2: {order:?}");
    assert_eq!(t.steps().into_iter().collect::<Vec<_>>(), vec![-1, 0]);
    let neg = t.get(Kind::Trajectory, -1, None, None).unwrap();
    assert!(neg.path.ends_with("trajectory/step_-00001.pt"));
}

#[test]
fn a_rank_missing_on_one_side_is_visible() {
    let t = DumpTree::discover(&root().join("weaver_faulty_pt")).unwrap();
    let ranks = t.ranks(Kind::IsLossDebug, 0);
    assert!(!ranks.contains(&10));
    assert_eq!(ranks.len(), 11);
    assert!(t.missing_cells(Kind::IsLossDebug, 0).is_empty());
}

#[test]
fn every_tensor_and_scalar_matches_the_generator() {
    let m = manifest();
    let mut checked_tensors = 0;
    let mut checked_views = 0;
    for (tree, _) in TREES {
        for f in manifest_files(&m, tree) {
            let path = root().join(f["path"].as_str().unwrap());
            let value = read_any(&path).unwrap_or_else(|e| panic!("{e}"));
            for (key, exp) in f["tensors"].as_object().unwrap() {
                let v = value
                    .get(key)
                    .unwrap_or_else(|| panic!("{path:?} lacks {key}"));
                let t = v.to_tensor().unwrap_or_else(|| panic!("{path:?} {key}"));
                let shape: Vec<usize> = exp["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as usize)
                    .collect();
                assert_eq!(t.shape(), shape.as_slice(), "{path:?} {key}");
                if let Some(dt) = exp["dtype"].as_str() {
                    assert_eq!(
                        Some(t.dtype()),
                        DType::from_torch_name(dt),
                        "{path:?} {key}"
                    );
                    let strides: Vec<usize> = exp["strides"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as usize)
                        .collect();
                    assert_eq!(t.strides(), strides.as_slice(), "{path:?} {key}");
                    assert_eq!(t.offset() as u64, exp["storage_offset"].as_u64().unwrap());
                    assert_eq!(
                        t.storage_numel() as u64,
                        exp["storage_numel"].as_u64().unwrap(),
                        "{path:?} {key}"
                    );
                    if t.offset() != 0 || !t.is_contiguous() {
                        checked_views += 1;
                    }
                }
                let vals = t.to_f64_vec();
                for (i, e) in exp["first4"].as_array().unwrap().iter().enumerate() {
                    assert!(same(vals[i], num(e).unwrap()), "{path:?} {key}[{i}]");
                }
                let nan = vals.iter().filter(|x| x.is_nan()).count();
                assert_eq!(
                    nan as u64,
                    exp["nan_count"].as_u64().unwrap(),
                    "{path:?} {key}"
                );
                let sum: f64 = vals.iter().filter(|x| !x.is_nan()).sum();
                let want = num(&exp["sum"]).unwrap();
                assert!(
                    same(sum, want) || (sum - want).abs() <= 1e-12 * want.abs().max(1.0),
                    "{path:?} {key}: sum {sum} vs {want}"
                );
                checked_tensors += 1;
            }
            for (key, exp) in f["scalars"].as_object().unwrap() {
                let Some(want) = num(exp) else { continue };
                let mut cur = &value;
                for part in key.split('.') {
                    cur = cur
                        .get(part)
                        .unwrap_or_else(|| panic!("{path:?} lacks {key}"));
                }
                let got = cur.as_f64().unwrap_or_else(|| panic!("{path:?} {key}"));
                assert!(same(got, want), "{path:?} {key}: {got} vs {want}");
            }
        }
    }
    assert!(checked_tensors > 500, "{checked_tensors}");
    assert!(
        checked_views >= 1,
        "the generator writes at least one strided view"
    );
}

/// Rows of a frame as comparable text, NaN-aware and order-preserving.
fn rows(df: &DataFrame) -> Vec<String> {
    (0..df.height())
        .map(|i| {
            df.columns()
                .iter()
                .map(|c| match c.get(i).unwrap() {
                    AnyValue::Float64(x) if x.is_nan() => "nan".to_string(),
                    AnyValue::Float64(x) => format!("{:?}", x),
                    other => format!("{other}"),
                })
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect()
}

fn names(df: &DataFrame) -> Vec<String> {
    df.get_column_names()
        .iter()
        .map(|s| s.to_string())
        .collect()
}

#[test]
fn pt_and_jsonl_dumps_give_identical_frames() {
    for (pt, jsonl) in [
        ("self_hosted_pt", "self_hosted_jsonl"),
        ("remote_api_pt", "remote_api_jsonl"),
        ("weaver_pt", "weaver_jsonl"),
    ] {
        let a = build_frames(&DumpTree::discover(&root().join(pt)).unwrap(), Some(0)).unwrap();
        let b = build_frames(&DumpTree::discover(&root().join(jsonl)).unwrap(), Some(0)).unwrap();
        for (x, y, what) in [
            (&a.scalars, &b.scalars, "scalars"),
            (&a.tokens, &b.tokens, "tokens"),
            (&a.trajectories, &b.trajectories, "trajectories"),
        ] {
            assert_eq!(names(x), names(y), "{pt} {what}");
            assert_eq!(x.height(), y.height(), "{pt} {what}");
            assert_eq!(rows(x), rows(y), "{pt} {what}");
        }
        assert!(a.scalars.height() > 0 || pt.starts_with("remote"));
    }
}

/// The rows of `df` at one file's coordinates.
fn at_file(df: &DataFrame, f: &J) -> DataFrame {
    let kind = df
        .column("kind")
        .unwrap()
        .str()
        .unwrap()
        .equal(f["kind"].as_str().unwrap());
    let mut mask = kind
        & df.column("step")
            .unwrap()
            .i64()
            .unwrap()
            .equal(f["step"].as_i64().unwrap());
    for c in ["rank", "micro"] {
        if !f[c].is_null() {
            let x = df.column(c).unwrap().i64().unwrap();
            mask = mask & x.equal(f[c].as_i64().unwrap());
        }
    }
    df.filter(&mask).unwrap()
}

/// Column `name` of `df` as optional f64s.
fn col_f64(df: &DataFrame, name: &str) -> Vec<Option<f64>> {
    let c = df
        .column(name)
        .unwrap()
        .cast(&polars::prelude::DataType::Float64)
        .unwrap();
    c.f64().unwrap().iter().collect()
}

/// Column `name` of `df` as optional strings.
fn col_str(df: &DataFrame, name: &str) -> Vec<Option<String>> {
    let c = df
        .column(name)
        .unwrap()
        .cast(&polars::prelude::DataType::String)
        .unwrap();
    c.str()
        .unwrap()
        .iter()
        .map(|x| x.map(str::to_string))
        .collect()
}

/// The frames of every tree (`.pt` and `.jsonl` alike) against the generator's manifest,
/// not against another frame: each trajectory's length, reward, mask sum, flags and ids;
/// each per-token tensor's element count and sum; each loss scalar.
#[test]
fn frames_match_the_generator_manifest() {
    let m = manifest();
    let (mut trajs, mut tensors, mut scalars) = (0, 0, 0);
    for (tree, _) in TREES {
        let t = DumpTree::discover(&root().join(tree)).unwrap();
        let frames = build_frames(&t, None).unwrap();
        for f in manifest_files(&m, tree) {
            let path = f["path"].as_str().unwrap();
            if let Some(items) = f["trajectories"]["items"].as_array() {
                let rows = at_file(&frames.trajectories, &f);
                assert_eq!(rows.height(), items.len(), "{path}");
                let (len, rew) = (col_f64(&rows, "length"), col_f64(&rows, "reward"));
                let (mask, adv) = (col_f64(&rows, "loss_mask_sum"), col_f64(&rows, "advantage"));
                let (group, uid, run) = (
                    col_str(&rows, "group_id"),
                    col_str(&rows, "uid"),
                    col_str(&rows, "run_id"),
                );
                let is_val = col_str(&rows, "is_val");
                let batch_adv = f["scalars"]["advantages"].as_array();
                for (i, it) in items.iter().enumerate() {
                    assert_eq!(len[i], it["length"].as_f64(), "{path}[{i}] length");
                    assert_eq!(rew[i], num(&it["reward"]), "{path}[{i}] reward");
                    assert_eq!(mask[i], it["loss_mask_sum"].as_f64(), "{path}[{i}] mask");
                    assert_eq!(
                        adv[i],
                        batch_adv.and_then(|a| num(&a[i])),
                        "{path}[{i}] adv"
                    );
                    let text = |j: &J| match j {
                        J::String(s) => Some(s.clone()),
                        J::Null => None,
                        other => Some(other.to_string()),
                    };
                    assert_eq!(group[i], text(&it["group_id"]), "{path}[{i}] group_id");
                    assert_eq!(uid[i], text(&it["uid"]), "{path}[{i}] uid");
                    assert_eq!(run[i], text(&it["run_id"]), "{path}[{i}] run_id");
                    assert_eq!(is_val[i], text(&it["is_val"]), "{path}[{i}] is_val");
                    trajs += 1;
                }
            }
            let ts = f["tensors"].as_object().unwrap();
            let reference = ts.get("log_probs").or_else(|| ts.get("old_log_probs"));
            if let (Some(reference), "forward_data" | "is_loss_debug" | "old_log_probs") =
                (reference, f["kind"].as_str().unwrap())
            {
                let rows = at_file(&frames.tokens, &f);
                for (key, exp) in ts.iter().filter(|(_, e)| e["shape"] == reference["shape"]) {
                    let vals = col_f64(&rows, key);
                    assert_eq!(
                        vals.len() as u64,
                        exp["numel"].as_u64().unwrap(),
                        "{path} {key}"
                    );
                    let nan = vals.iter().filter(|x| x.unwrap().is_nan()).count();
                    assert_eq!(
                        nan as u64,
                        exp["nan_count"].as_u64().unwrap(),
                        "{path} {key}"
                    );
                    let sum: f64 = vals
                        .iter()
                        .map(|x| x.unwrap())
                        .filter(|x| !x.is_nan())
                        .sum();
                    let want = num(&exp["sum"]).unwrap();
                    assert!(
                        (sum - want).abs() <= 1e-12 * want.abs().max(1.0),
                        "{path} {key}: sum {sum} vs {want}"
                    );
                    tensors += 1;
                }
            }
            if f["kind"] == "loss" {
                let rows = at_file(&frames.scalars, &f);
                let keys = col_str(&rows, "key");
                let vals = col_f64(&rows, "value");
                for (key, exp) in f["scalars"].as_object().unwrap() {
                    let Some(want) = num(exp).filter(|_| !exp.is_boolean()) else {
                        continue;
                    };
                    let i = keys
                        .iter()
                        .position(|k| k.as_deref() == Some(key.as_str()))
                        .unwrap_or_else(|| panic!("{path}: no scalar {key}"));
                    assert!(same(vals[i].unwrap(), want), "{path} {key}");
                    scalars += 1;
                }
            }
        }
    }
    let f = build_frames(
        &DumpTree::discover(&root().join("weaver_pt")).unwrap(),
        None,
    )
    .unwrap();
    let names: Vec<&str> = f.tables().iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["scalars", "tokens", "trajectories"]);
    assert_eq!(f.tables()[1].1.height(), f.tokens.height());
    assert!(trajs >= 4 * 48, "{trajs}");
    assert!(tensors >= 100, "{tensors}");
    assert!(scalars >= 100, "{scalars}");
}

#[test]
fn frames_hold_the_expected_rows() {
    let tree = DumpTree::discover(&root().join("self_hosted_pt")).unwrap();
    let f = build_frames(&tree, Some(0)).unwrap();
    // 12 ranks x 2 micros of forward_data [2, R] plus the whole-batch old_log_probs [48, R].
    let olp_file = read_any(&root().join("self_hosted_pt/old_log_probs/step_000000.pt")).unwrap();
    let r = olp_file
        .get("old_log_probs")
        .unwrap()
        .to_tensor()
        .unwrap()
        .shape()[1];
    assert!(r > 0);
    let fd = f.tokens.clone().of_kind("forward_data");
    assert_eq!(fd.height(), 12 * 2 * 2 * r);
    let olp = f.tokens.clone().of_kind("old_log_probs");
    assert_eq!(olp.height(), 48 * r);
    assert_eq!(f.trajectories.height(), 48);
    let losses = f.scalars.clone().of_kind("loss");
    let keys: BTreeSet<String> = losses
        .column("key")
        .unwrap()
        .str()
        .unwrap()
        .iter()
        .flatten()
        .map(str::to_string)
        .collect();
    for k in ["loss", "pg_loss", "entropy_loss", "metrics.approx_kl"] {
        assert!(keys.contains(k), "{k} not in {keys:?}");
    }
}

/// Filter a frame to one `kind` (small helper so tests read plainly).
trait KindFilter {
    fn of_kind(self, kind: &str) -> DataFrame;
}

impl KindFilter for DataFrame {
    fn of_kind(self, kind: &str) -> DataFrame {
        let mask = self.column("kind").unwrap().str().unwrap().equal(kind);
        self.filter(&mask).unwrap()
    }
}

#[test]
fn datums_match_their_trajectories_across_the_one_token_shift() {
    let m = manifest();
    let tree = DumpTree::discover(&root().join("remote_api_pt")).unwrap();
    let f = build_frames(&tree, Some(0)).unwrap();
    let t = &f.trajectories;
    let kinds: Vec<String> = t
        .column("kind")
        .unwrap()
        .str()
        .unwrap()
        .iter()
        .flatten()
        .map(str::to_string)
        .collect();
    let hashes: Vec<u64> = t
        .column("tokens_hash")
        .unwrap()
        .u64()
        .unwrap()
        .into_no_null_iter()
        .collect();
    let mut traj_hash = BTreeMap::new();
    let mut datum_hash = BTreeMap::new();
    for (i, k) in kinds.iter().enumerate() {
        let idx = t
            .column("index")
            .unwrap()
            .get(i)
            .unwrap()
            .extract::<i64>()
            .unwrap();
        match k.as_str() {
            "prepared_trajectories" => traj_hash.insert(idx, hashes[i]),
            "datums" => datum_hash.insert(idx, hashes[i]),
            _ => None,
        };
    }
    let dat = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "remote_api_pt/datums/step_000000.pt")
        .unwrap();
    let items = dat["datums"]["items"].as_array().unwrap();
    assert_eq!(datum_hash.len(), items.len());
    assert!(
        items.len() < traj_hash.len(),
        "all-zero-advantage datums are dropped"
    );
    for it in items {
        let d = it["index"].as_i64().unwrap();
        let ti = it["trajectory_index"].as_i64().unwrap();
        assert_eq!(
            datum_hash[&d], traj_hash[&ti],
            "datum {d} ↔ trajectory {ti}"
        );
    }
    assert_ne!(tokens_hash(&[1, 2, 3]), tokens_hash(&[1, 2]));
}

#[test]
fn format_comes_from_the_extension() {
    assert_eq!(
        FileFormat::from_path(Path::new("a/b.PT")),
        Some(FileFormat::Pt)
    );
    assert_eq!(FileFormat::from_path(Path::new("a/b.txt")), None);
    // Without a known extension the first bytes decide; text that is no dump is refused.
    let dir = tempfile::tempdir().unwrap();
    let txt = dir.path().join("x.txt");
    std::fs::write(&txt, b"loss went up\n").unwrap();
    assert!(matches!(
        read_any(&txt),
        Err(rlforensics::Error::Format { .. })
    ));
    std::fs::write(&txt, b"{\"loss\": 0.5}\n").unwrap();
    assert_eq!(
        read_any(&txt).unwrap().get("loss").and_then(Value::as_f64),
        Some(0.5)
    );
    assert!(matches!(
        read_any(&dir.path().join("missing.txt")),
        Err(rlforensics::Error::Io { .. })
    ));
}

/// Every fixture file mapped through its tree's producer mapping into the typed model:
/// per-token tensors with the generator's shape, stored dtype (none for JSON lists) and
/// provenance; trajectory and datum counts; the loss record's terms.
#[test]
fn every_fixture_file_maps_into_the_model_as_the_generator_wrote_it() {
    use rlforensics::model::step::LogProbSource;
    use rlforensics::producers::mapping;
    let m = manifest();
    let (mut batches, mut records) = (0, 0);
    for (tree, producer) in TREES {
        let t = DumpTree::discover(&root().join(tree)).unwrap();
        let map = mapping(producer);
        for f in manifest_files(&m, tree) {
            let path = root().join(f["path"].as_str().unwrap());
            let kind = Kind::from_dir_name(f["kind"].as_str().unwrap()).unwrap();
            assert!(t.files().iter().any(|d| d.path == path), "{path:?}");
            let v = read_any(&path).unwrap();
            if let Some(b) = map.token_batch(kind, &path, &v).unwrap() {
                let mut tensors = vec![
                    ("log_probs", b.log_probs(LogProbSource::Current)),
                    ("entropy", b.entropy.as_ref()),
                    ("response_mask", b.response_mask.as_ref()),
                    ("input_ids", b.input_ids.as_ref()),
                    ("advantages", b.advantages.as_ref()),
                    ("effective_valid", b.loss_mask.as_ref()),
                    ("prob_ratio", b.ratio.as_ref()),
                    ("elementwise_loss", b.per_token_loss.as_ref()),
                    ("attention_mask", b.attention_mask.as_ref()),
                ];
                if kind == Kind::IsLossDebug || kind == Kind::OldLogProbs {
                    tensors.push(("old_log_probs", b.log_probs(LogProbSource::Old)));
                }
                for (key, got) in tensors {
                    let exp = &f["tensors"][key];
                    if exp.is_null() {
                        assert!(got.is_none(), "{path:?} {key}");
                        continue;
                    }
                    let got = got.unwrap_or_else(|| panic!("{path:?} {key} not mapped"));
                    let shape: Vec<usize> = exp["shape"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as usize)
                        .collect();
                    assert_eq!(got.tensor.shape(), shape.as_slice(), "{path:?} {key}");
                    let want_dtype = exp["dtype"].as_str().and_then(DType::from_torch_name);
                    assert_eq!(got.dtype, want_dtype, "{path:?} {key}");
                    assert_eq!(
                        (got.source.file.as_path(), got.source.key.as_str()),
                        (path.as_path(), key)
                    );
                    batches += 1;
                }
            }
            if let Some(b) = map.trajectories(kind, &path, &v).unwrap() {
                let want = f["trajectories"]["count"].as_u64().unwrap() as usize;
                assert_eq!(b.rows.len(), want, "{path:?}");
                records += 1;
            }
            if let Some(d) = map.datums(kind, &path, &v).unwrap() {
                let want = f["datums"]["items"].as_array().map(Vec::len);
                assert_eq!(Some(d.rows.len()), want, "{path:?}");
                records += 1;
            }
            if let Some(p) = map.param(kind, &path, &v).unwrap() {
                let key = f["kind"].as_str().unwrap();
                let exp = &f["tensors"][key];
                assert_eq!(p.gradient, kind == Kind::Gradient, "{path:?}");
                assert_eq!(p.name.as_deref(), f["scalars"]["param_name"].as_str());
                let want_dtype = exp["dtype"].as_str().and_then(DType::from_torch_name);
                assert_eq!(p.tensor.dtype, want_dtype, "{path:?}");
                assert_eq!(p.tensor.tensor.shape(), &[16, 8], "{path:?}");
                let sum: f64 = p.tensor.tensor.to_f64_vec().iter().sum();
                let want = num(&exp["sum"]).unwrap();
                assert!(
                    (sum - want).abs() <= 1e-12 * want.abs().max(1.0),
                    "{path:?}"
                );
                records += 1;
            }
            if kind == Kind::TrainingMetrics {
                let r = map.loss_record(kind, &path, &v).unwrap().unwrap();
                let sc = &f["scalars"];
                assert_eq!(r.loss, num(&sc["metrics.loss"]), "{path:?}");
                assert_eq!(r.pg_loss, num(&sc["metrics.pg_loss"]), "{path:?}");
                assert_eq!(
                    r.kl.get("approx_kl").copied(),
                    num(&sc["metrics.approx_kl"])
                );
                records += 1;
            } else if let Some(r) = map.loss_record(kind, &path, &v).unwrap() {
                let sc = &f["scalars"];
                assert_eq!(r.loss, num(&sc["loss"]), "{path:?}");
                assert_eq!(r.pg_loss, num(&sc["pg_loss"]), "{path:?}");
                assert_eq!(r.entropy_loss, num(&sc["entropy_loss"]), "{path:?}");
                assert_eq!(
                    r.kl.get("approx_kl").copied(),
                    num(&sc["metrics.approx_kl"])
                );
                let coeff = r.coefficients.get("entropy_coeff").copied();
                assert_eq!(coeff, num(&sc["extra_info.entropy_coeff"]), "{path:?}");
                records += 1;
            }
        }
    }
    assert!(batches >= 400, "{batches}");
    assert!(records >= 100, "{records}");
}
