//! The NexRL producers read through the door ([`super::StepReader`]) on the shipped
//! fixtures. Expected values were read from the fixtures with torch / safetensors'
//! own loaders (shapes, dtypes, `loss`, `extra_info`, file counts), not with this crate.

use std::path::{Path, PathBuf};

use super::step_reader_for;
use crate::model::conventions::{ConventionKey, ConventionSource, ConventionValue};
use crate::model::step::{LogProbSource, TokenPositions};
use crate::tensor::DType;

fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(p)
}

#[test]
fn a_self_hosted_tree_is_one_door_cells_conventions_and_what_was_not_placed() {
    let root = fixture("dumps/self_hosted_pt");
    let r = step_reader_for(&root).unwrap();
    assert_eq!(r.name(), "nexrl-self-hosted");
    // A validation-only step -1 (trajectory/step_-00001.pt) and step 0.
    assert_eq!(r.steps(&root).unwrap(), vec![-1, 0]);
    let s = r.read_step(&root, 0).unwrap();
    assert_eq!(s.step, 0);
    // 12 ranks x 2 micros (forward_data + loss), and the whole batch (old_log_probs +
    // trajectory) as rank 0 without a micro.
    assert_eq!(s.cells.len(), 25);
    let whole = s.cells.iter().find(|c| c.micro.is_none()).unwrap();
    assert!(whole.batch.log_probs(LogProbSource::Old).is_some());
    assert!(!whole.batch.rows.is_empty());
    let c = s
        .cells
        .iter()
        .find(|c| c.rank == 0 && c.micro == Some(0))
        .unwrap();
    let lp = c.batch.log_probs(LogProbSource::Current).unwrap();
    assert_eq!(lp.tensor.shape(), &[2, 24]);
    assert_eq!(lp.dtype, Some(DType::F32));
    assert_eq!(c.batch.entropy.as_ref().unwrap().dtype, Some(DType::BF16));
    assert_eq!(c.batch.input_ids.as_ref().unwrap().tensor.shape(), &[2, 37]);
    assert_eq!(c.loss.as_ref().unwrap().loss, Some(-0.20065973699092865));
    assert_eq!(c.files.len(), 2);
    // extra_info: entropy_coeff 0.0, loss_agg_mode token-mean, each with its file and key.
    let e = s.conventions.get(ConventionKey::EntropyCoeff).unwrap();
    assert_eq!(e.value, ConventionValue::Number(0.0));
    match &e.source {
        ConventionSource::Dumped { at } => {
            assert_eq!(at.key, "extra_info.entropy_coeff");
            assert!(at.file.starts_with(root.join("loss")), "{at:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.conventions.get(ConventionKey::Aggregation).unwrap().value,
        ConventionValue::Name("token-mean".into())
    );
    assert_eq!(s.conventions.get(ConventionKey::KlCoeff), None);
    // 12 param + 12 gradient files, each said.
    assert_eq!(s.unplaced.len(), 24, "{:?}", s.unplaced);
    assert!(s
        .unplaced
        .iter()
        .all(|u| u.contains("param") || u.contains("gradient")));
}

#[test]
fn a_weaver_tree_merges_a_micros_files_into_one_cell() {
    let root = fixture("dumps/weaver_pt");
    let r = step_reader_for(&root).unwrap();
    assert_eq!(r.name(), "nexrl-weaver");
    let s = r.read_step(&root, 0).unwrap();
    assert_eq!(s.cells.len(), 24);
    assert!(s
        .cells
        .iter()
        .all(|c| c.micro.is_some() && c.files.len() == 4));
    let b = &s.cells[0].batch;
    assert_eq!(
        b.log_probs.keys().copied().collect::<Vec<_>>(),
        vec![LogProbSource::Old, LogProbSource::Current]
    );
    for t in [&b.advantages, &b.ratio, &b.per_token_loss, &b.loss_mask] {
        assert_eq!(t.as_ref().unwrap().tensor.shape(), &[2, 24]);
    }
    assert_eq!(b.input_ids.as_ref().unwrap().tensor.shape(), &[2, 36]);
    assert_eq!(
        s.cells[0].loss.as_ref().unwrap().loss,
        Some(-0.200513556599617)
    );
    assert_eq!(s.unplaced.len(), 48);
    let e = r.read_step(&root, 3).unwrap_err().to_string();
    assert!(e.contains("no files of step 3") && e.contains("[0]"), "{e}");
}

#[test]
fn a_remote_api_tree_pads_its_datums_into_a_sequence_batch() {
    let root = fixture("dumps/remote_api_pt");
    let r = step_reader_for(&root).unwrap();
    assert_eq!(r.name(), "nexrl-remote-api");
    let s = r.read_step(&root, 0).unwrap();
    assert_eq!(s.cells.len(), 1);
    let c = &s.cells[0];
    let b = &c.batch;
    assert_eq!(b.positions, TokenPositions::Sequence);
    let lp = b.log_probs(LogProbSource::Rollout).unwrap();
    // 40 datums, the longest 36 tokens.
    assert_eq!(lp.tensor.shape(), &[40, 36]);
    assert_eq!(lp.source.key, "datums[*].logprobs");
    // The mask's ones: every datum's loss_mask summed by torch (582), none added by padding.
    let ones: f64 = b
        .loss_mask
        .as_ref()
        .unwrap()
        .tensor
        .to_f64_vec()
        .iter()
        .sum();
    assert_eq!(ones, 582.0);
    assert_eq!(c.loss.as_ref().unwrap().loss, Some(-0.04745401814579964));
}

#[test]
fn a_loose_tensors_file_is_one_cell_of_step_0() {
    let file = fixture("kernels/kl_verl_abs.safetensors");
    let r = step_reader_for(&file).unwrap();
    assert_eq!(r.name(), "loose-tensors");
    let s = r.read_step(&file, 0).unwrap();
    let b = &s.cells[0].batch;
    let lp = b.log_probs(LogProbSource::Current).unwrap();
    assert_eq!(lp.tensor.shape(), &[8, 10]);
    let sum: f64 = lp.tensor.to_f64_vec().iter().sum();
    assert!((sum - -130.1606732555037).abs() < 1e-9, "{sum}");
    assert!(b.log_probs(LogProbSource::Reference).is_some());
    assert!(r.read_step(&file, 1).is_err());
    // A file of another kind is no loose-tensors file.
    assert!(step_reader_for(&fixture("kernels/adv_trl_batch.safetensors")).is_err());
}
