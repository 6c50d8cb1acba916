//! Normalisation of a dump tree into three polars frames, the shape every command and
//! every user's notebook can work with, and their Parquet export:
//!
//! - **scalars**: one row per number in a file (step, rank, micro, kind, key, value), keys
//!   flattened with dots (`metrics.approx_kl`);
//! - **tokens**: one row per (file, row, pos) with one f64 column per token-level tensor
//!   (`log_probs`, `entropy`, `response_mask`, `old_log_probs`, `prob_ratio`, …);
//! - **trajectories**: one row per trajectory or datum (index, token hash, length, reward,
//!   loss_mask sum, advantage, group/uid/run_id).
//!
//! Every value is f64 (exact for every float dtype), so a `.pt` dump and its `.jsonl` twin
//! give identical frames.

pub mod log;
pub mod stack;

use std::collections::HashMap;
use std::path::Path;

use polars::prelude::{Column, DataFrame, ParquetWriter};
use rayon::prelude::*;

use crate::error::{Error, Position, Result};
use crate::formats::{read_any, FileFormat};
use crate::model::tokens::TokenSeq;
use crate::model::trajectory::TrajectoryIds;
use crate::producers::layout::{DumpFile, DumpTree, Kind};
use crate::producers::{nexrl_self_hosted, remote_api};
use crate::value::Value;

/// The frames of a whole-step producer's tree or file ([`stack::frames_of_steps`]): `step`,
/// else every step it holds. `None` when no such producer recognises `path`.
fn stack_frames(path: &Path, step: Option<i64>) -> Option<Result<Frames>> {
    let reader = crate::producers::step_reader_for(path).ok()?;
    Some((|| {
        let steps = match step {
            Some(s) => vec![s],
            None => reader.steps(path)?,
        };
        let dumps = steps
            .iter()
            .map(|s| reader.read_step(path, *s))
            .collect::<Result<Vec<_>>>()?;
        stack::frames_of_steps(&dumps)
    })())
}

/// The three normalised frames of one dump tree.
pub struct Frames {
    /// step, rank, micro, kind, key, value.
    pub scalars: DataFrame,
    /// kind, step, rank, micro, row, pos, then one column per token-level tensor.
    pub tokens: DataFrame,
    /// kind, step, index, tokens_hash, length, reward, loss_mask_sum, advantage, is_val,
    /// group_id, uid, run_id, task_id.
    pub trajectories: DataFrame,
}

pub use crate::model::tokens::{tokens_hash, tokens_hash_iter, value_tokens_hash};

impl Frames {
    /// Every table by name (`scalars`, `tokens`, `trajectories`), in that order: what a
    /// notebook or a Python binding hands over as polars DataFrames.
    pub fn tables(&self) -> [(&'static str, &DataFrame); 3] {
        [
            ("scalars", &self.scalars),
            ("tokens", &self.tokens),
            ("trajectories", &self.trajectories),
        ]
    }
}

/// Read every file of `tree` (only `step` when given) in parallel, each once, and build
/// the three frames.
pub fn build_frames(tree: &DumpTree, step: Option<i64>) -> Result<Frames> {
    let files: Vec<&DumpFile> = tree
        .files()
        .iter()
        .filter(|f| step.is_none_or(|s| f.step == s))
        .collect();
    let values: Vec<Value> = files
        .par_iter()
        .map(|f| read_any(&f.path))
        .collect::<Result<_>>()?;
    let pairs: Vec<(&DumpFile, &Value)> = files.iter().copied().zip(values.iter()).collect();
    frames_of(&pairs)
}

/// The frames of files already read (one file for `--inspect FILE --export-frames`).
pub fn frames_of(pairs: &[(&DumpFile, &Value)]) -> Result<Frames> {
    let pairs = pairs.to_vec();
    Ok(Frames {
        scalars: scalar_frame(&pairs)?,
        tokens: token_frame(&pairs)?,
        trajectories: trajectory_frame(&pairs)?,
    })
}

pub(crate) fn polars_err(e: polars::prelude::PolarsError) -> Error {
    Error::internal(format!("building a frame failed: {e}"))
}

/// Columns every per-file frame starts with.
struct Coords {
    kind: Vec<String>,
    step: Vec<i64>,
    rank: Vec<Option<i64>>,
    micro: Vec<Option<i64>>,
}

impl Coords {
    fn new() -> Self {
        Coords {
            kind: Vec::new(),
            step: Vec::new(),
            rank: Vec::new(),
            micro: Vec::new(),
        }
    }

    fn push(&mut self, f: &DumpFile, n: usize) {
        for _ in 0..n {
            self.kind.push(f.kind.dir_name().to_string());
            self.step.push(f.step);
            self.rank.push(f.rank.map(i64::from));
            self.micro.push(f.micro.map(i64::from));
        }
    }

    fn into_columns(self) -> Vec<Column> {
        vec![
            Column::new("kind".into(), self.kind),
            Column::new("step".into(), self.step),
            Column::new("rank".into(), self.rank),
            Column::new("micro".into(), self.micro),
        ]
    }
}

/// Flatten every number (and one-element tensor) of a file into (key, value) rows.
fn scalar_frame(pairs: &[(&DumpFile, &Value)]) -> Result<DataFrame> {
    let mut coords = Coords::new();
    let mut keys = Vec::new();
    let mut values = Vec::new();
    for (f, v) in pairs {
        let mut rows = Vec::new();
        flatten_scalars(v, String::new(), &mut rows);
        coords.push(f, rows.len());
        for (k, x) in rows {
            keys.push(k);
            values.push(x);
        }
    }
    let height = keys.len();
    let mut cols = coords.into_columns();
    cols.push(Column::new("key".into(), keys));
    cols.push(Column::new("value".into(), values));
    DataFrame::new(height, cols).map_err(polars_err)
}

fn flatten_scalars(v: &Value, prefix: String, out: &mut Vec<(String, f64)>) {
    match v {
        Value::Dict(items) => {
            for (k, val) in items {
                let name = match k {
                    Value::Str(s) => s.clone(),
                    Value::Int(i) => i.to_string(),
                    _ => continue,
                };
                let key = if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}.{name}")
                };
                flatten_scalars(val, key, out);
            }
        }
        Value::Tensor(t) if t.numel() == 1 && t.ndim() == 0 => {
            if let Some(x) = t.scalar_f64() {
                out.push((prefix, x));
            }
        }
        _ if v.is_number() => {
            if let Some(x) = v.as_f64() {
                out.push((prefix, x));
            }
        }
        _ => {}
    }
}

/// One file's token-level tensors: names and row-major values of a common [rows, cols] shape.
struct TokenBlock<'a> {
    file: &'a DumpFile,
    rows: usize,
    cols: usize,
    columns: Vec<(String, Vec<f64>)>,
}

/// The 2-D tensors of a dict that share the shape of its `log_probs` (or of its first
/// 2-D float tensor): the per-token quantities of a forward/loss file.
fn token_block<'a>(file: &'a DumpFile, v: &Value) -> Option<TokenBlock<'a>> {
    let items = v.as_dict()?;
    let mut tensors = Vec::new();
    for (k, val) in items {
        let (Some(name), Some(t)) = (k.as_str(), candidate_tensor(val)) else {
            continue;
        };
        if t.ndim() == 2 {
            tensors.push((name.to_string(), t));
        }
    }
    let reference = tensors
        .iter()
        .find(|(n, _)| n == nexrl_self_hosted::LOG_PROBS)
        .or_else(|| tensors.iter().find(|(_, t)| t.dtype().is_float()))
        .or(tensors.first())?;
    let shape = reference.1.shape().to_vec();
    let columns = tensors
        .iter()
        .filter(|(_, t)| t.shape() == shape.as_slice())
        .map(|(n, t)| (n.clone(), t.to_f64_vec()))
        .collect();
    Some(TokenBlock {
        file,
        rows: shape[0],
        cols: shape[1],
        columns,
    })
}

/// A tensor or a nested list of numbers (the `.jsonl` spelling of a tensor).
fn candidate_tensor(v: &Value) -> Option<crate::tensor::Tensor> {
    match v {
        Value::Tensor(t) => Some(t.clone()),
        Value::List(_) | Value::Packed(_) => v.to_tensor(),
        _ => None,
    }
}

/// Datums hold per-token lists per datum; each becomes one row of the block.
fn datum_block<'a>(file: &'a DumpFile, v: &Value) -> Option<TokenBlock<'a>> {
    let datums = v.get(remote_api::DATUMS)?.as_seq()?;
    let mut names: Vec<String> = Vec::new();
    let mut per_datum: Vec<HashMap<String, Vec<f64>>> = Vec::new();
    let mut cols = 0;
    for d in datums {
        let mut m = HashMap::new();
        if let Some(inputs) = d.get(remote_api::LOSS_FN_INPUTS).and_then(Value::as_dict) {
            for (k, val) in inputs {
                let (Some(name), Some(t)) = (k.as_str(), candidate_tensor(val)) else {
                    continue;
                };
                if t.ndim() != 1 {
                    continue;
                }
                if !names.iter().any(|n| n == name) {
                    names.push(name.to_string());
                }
                cols = cols.max(t.numel());
                m.insert(name.to_string(), t.to_f64_vec());
            }
        }
        per_datum.push(m);
    }
    let columns = names
        .iter()
        .map(|n| {
            let mut col = Vec::with_capacity(per_datum.len() * cols);
            for m in &per_datum {
                let vals = m.get(n).map(Vec::as_slice).unwrap_or(&[]);
                col.extend((0..cols).map(|i| vals.get(i).copied().unwrap_or(f64::NAN)));
            }
            (n.clone(), col)
        })
        .collect();
    Some(TokenBlock {
        file,
        rows: per_datum.len(),
        cols,
        columns,
    })
}

fn token_frame(pairs: &[(&DumpFile, &Value)]) -> Result<DataFrame> {
    let blocks: Vec<TokenBlock> = pairs
        .iter()
        .filter_map(|(f, v)| match f.kind {
            Kind::ForwardData | Kind::IsLossDebug | Kind::OldLogProbs => token_block(f, v),
            Kind::Datums => datum_block(f, v),
            _ => None,
        })
        .collect();
    let mut names: Vec<String> = Vec::new();
    for b in &blocks {
        for (n, _) in &b.columns {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
    }
    let height: usize = blocks.iter().map(|b| b.rows * b.cols).sum();
    let mut coords = Coords::new();
    let mut row = Vec::with_capacity(height);
    let mut pos = Vec::with_capacity(height);
    let mut data: Vec<Vec<Option<f64>>> =
        names.iter().map(|_| Vec::with_capacity(height)).collect();
    for b in &blocks {
        let n = b.rows * b.cols;
        coords.push(b.file, n);
        for r in 0..b.rows {
            for p in 0..b.cols {
                row.push(r as i64);
                pos.push(p as i64);
            }
        }
        for (name, col) in names.iter().zip(data.iter_mut()) {
            match b.columns.iter().find(|(n2, _)| n2 == name) {
                Some((_, vals)) => col.extend(vals.iter().map(|&x| Some(x))),
                None => col.extend(std::iter::repeat_n(None, n)),
            }
        }
    }
    let mut cols = coords.into_columns();
    cols.push(Column::new("row".into(), row));
    cols.push(Column::new("pos".into(), pos));
    for (name, col) in names.iter().zip(data) {
        cols.push(Column::new(name.as_str().into(), col));
    }
    DataFrame::new(height, cols).map_err(polars_err)
}

#[derive(Default)]
struct TrajColumns {
    coords: Vec<(String, i64)>,
    index: Vec<i64>,
    hash: Vec<Option<u64>>,
    length: Vec<Option<i64>>,
    reward: Vec<Option<f64>>,
    mask_sum: Vec<Option<f64>>,
    advantage: Vec<Option<f64>>,
    is_val: Vec<Option<bool>>,
    ids: [Vec<Option<String>>; 4],
}

/// One row per trajectory (`trajectory/`, `prepared_trajectories/`) or datum (`datums/`),
/// read through the producers' one mapping ([`crate::producers`]).
fn trajectory_frame(pairs: &[(&DumpFile, &Value)]) -> Result<DataFrame> {
    let mut c = TrajColumns::default();
    for (f, v) in pairs {
        let kind = f.kind.dir_name().to_string();
        match f.kind {
            Kind::Trajectory | Kind::PreparedTrajectories => {
                for t in nexrl_self_hosted::trajectories(&f.path, v)?.rows {
                    c.coords.push((kind.clone(), f.step));
                    c.index.push(t.index as i64);
                    c.hash.push(t.tokens.as_ref().map(TokenSeq::hash));
                    c.length.push(t.tokens.as_ref().map(|t| t.len() as i64));
                    c.reward.push(t.reward);
                    c.mask_sum.push(t.loss_mask.as_ref().map(TokenSeq::sum));
                    c.advantage.push(t.advantage);
                    c.is_val.push(t.is_val);
                    let TrajectoryIds {
                        group_id,
                        uid,
                        run_id,
                        task_id,
                        ..
                    } = t.ids;
                    for (slot, id) in c.ids.iter_mut().zip([group_id, uid, run_id, task_id]) {
                        slot.push(id);
                    }
                }
            }
            Kind::Datums => {
                for d in remote_api::datums(&f.path, v)?.rows {
                    let tokens = d.tokens();
                    c.coords.push((kind.clone(), f.step));
                    c.index.push(d.index as i64);
                    c.hash.push(tokens.as_deref().map(tokens_hash));
                    c.length.push(tokens.as_ref().map(|t| t.len() as i64));
                    c.reward.push(None);
                    c.mask_sum.push(
                        d.loss_mask
                            .as_ref()
                            .map(|m| m.iter().map(|&x| x as i64 as f64).sum()),
                    );
                    c.advantage.push(d.first_masked_advantage());
                    c.is_val.push(None);
                    for slot in c.ids.iter_mut() {
                        slot.push(None);
                    }
                }
            }
            _ => {}
        }
    }
    let height = c.index.len();
    let (kinds, steps): (Vec<String>, Vec<i64>) = c.coords.into_iter().unzip();
    let [group, uid, run, task] = c.ids;
    let cols = vec![
        Column::new("kind".into(), kinds),
        Column::new("step".into(), steps),
        Column::new("index".into(), c.index),
        Column::new("tokens_hash".into(), c.hash),
        Column::new("length".into(), c.length),
        Column::new("reward".into(), c.reward),
        Column::new("loss_mask_sum".into(), c.mask_sum),
        Column::new("advantage".into(), c.advantage),
        Column::new("is_val".into(), c.is_val),
        Column::new("group_id".into(), group),
        Column::new("uid".into(), uid),
        Column::new("run_id".into(), run),
        Column::new("task_id".into(), task),
    ];
    DataFrame::new(height, cols).map_err(polars_err)
}

/// Write a frame to a Parquet file (zstd, with statistics), readable by pandas, polars,
/// DuckDB and Spark.
pub fn write_parquet(df: &mut DataFrame, path: &Path) -> Result<()> {
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    ParquetWriter::new(file)
        .finish(df)
        .map(|_| ())
        .map_err(|e| Error::Export {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })
}

/// Write the three frames as `scalars.parquet`, `tokens.parquet`, `trajectories.parquet`
/// into `dir` (created if missing); returns the paths written.
pub fn export_frames(frames: &mut Frames, dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut written = Vec::new();
    for (name, df) in [
        ("scalars", &mut frames.scalars),
        ("tokens", &mut frames.tokens),
        ("trajectories", &mut frames.trajectories),
    ] {
        let path = dir.join(format!("{name}.parquet"));
        write_parquet(df, &path)?;
        written.push(path);
    }
    Ok(written)
}
/// The Parquet frames of a dump folder, or of one dump file inside a kind folder
/// (`forward_data/step_000003_rank1_micro0.pt`), for `--inspect PATH --export-frames DIR`.
pub fn frames_for_path(path: &Path, step: Option<i64>) -> Result<Frames> {
    if crate::formats::source::is_dir(path) {
        // a NexRL tree, else a whole-step producer's (verl, slime, NeMo-RL, …)
        return match DumpTree::discover(path) {
            Ok(tree) => build_frames(&tree, step),
            Err(e) => stack_frames(path, step).unwrap_or(Err(e)),
        };
    }
    let kind = path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .and_then(Kind::from_dir_name);
    let coords = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(crate::producers::layout::parse_stem);
    let (Some(kind), Some((file_step, rank, micro))) = (kind, coords) else {
        if let Some(frames) = stack_frames(path, step) {
            return frames;
        }
        return Err(Error::format(
            path,
            Position::File,
            "frames need the file's kind, step, rank and micro: it must sit in a kind folder \
             (trajectory/, forward_data/, loss/ …) and be named step_<N>[_rank<R>][_micro<M>]",
        ));
    };
    let value = read_any(path)?;
    let file = crate::producers::layout::DumpFile {
        path: path.to_path_buf(),
        kind,
        step: file_step,
        rank,
        micro,
        format: FileFormat::from_path(path).unwrap_or(FileFormat::Pt),
        size: crate::formats::source::size(path)?,
    };
    let pairs: Vec<(&crate::producers::layout::DumpFile, &Value)> =
        if step.is_none_or(|s| s == file_step) {
            vec![(&file, &value)]
        } else {
            Vec::new()
        };
    frames_of(&pairs)
}
