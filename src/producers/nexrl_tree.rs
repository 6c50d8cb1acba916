//! A NexRL dump tree's step read into the model ([`StepDump`]): the three layouts NexRL
//! writes (self-hosted, weaver, remote-API; `readers::layout` tells them apart by their
//! folders) share one walk — every file of the step is read once and handed to its
//! producer's [`StepMapping`], and the records land in the rank × micro cell the file's
//! name gives; what the files state about the loss's conventions goes into the
//! conventions record ([`StepMapping::conventions`]). No key is spelled here: each
//! producer's file holds its own.
//!
//! Layouts: NexRL `nexrl/trainer/self_hosted_trainer.py` and the weaver / remote-API
//! trainers' dump hooks write `DIR/<kind>/step_N[_rankR][_microM].<ext>` (see
//! [`super::layout`] and [`super::nexrl_self_hosted`] for the keys and the commit read).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use super::{mapping, StepMapping};
use crate::error::{Error, Result};
use crate::formats::read_any;
use crate::model::conventions::Conventions;
use crate::model::step::{
    Cell, RowMeta, StepCells, StepDump, TokenBatch, TokenPositions, TokenTensor,
};
use crate::model::tree::{DumpFile, DumpTree, Kind, Producer};
use crate::value::Value;

/// Whether `root` is a NexRL dump folder whose layout is `producer`.
pub(crate) fn detect(root: &Path, producer: Producer) -> bool {
    root.is_dir() && DumpTree::discover(root).is_ok_and(|t| t.producer == producer)
}

/// The steps of the NexRL dump folder `root`, ascending.
///
/// Errors: `root` not a dump folder.
pub(crate) fn steps(root: &Path) -> Result<Vec<i64>> {
    Ok(DumpTree::discover(root)?.steps().into_iter().collect())
}

/// Step `step` of the NexRL dump folder `root` in the model, read by `name`'s mapping.
///
/// Errors: `root` not a dump folder; no file of `step` (naming the steps there are); a
/// file unreadable or a key of the wrong type (named with file and key).
pub(crate) fn read_step(root: &Path, step: i64, name: &str) -> Result<StepDump> {
    let tree = DumpTree::discover(root)?;
    let files = step_files(&tree, step)?;
    let map = mapping(tree.producer);
    let mut cells: BTreeMap<(usize, Option<usize>), Cell> = BTreeMap::new();
    let mut conventions = Conventions::default();
    let mut unplaced: Vec<String> = tree
        .unrecognised
        .iter()
        .map(|u| format!("{}: {}", u.path.display(), u.reason))
        .collect();
    for f in files {
        if matches!(f.kind, Kind::Param | Kind::Gradient) {
            // A step's cells hold what the loss saw; parameters are read by `inspect`.
            unplaced.push(format!(
                "{}: a {} file (parameters are not part of a step's cells)",
                f.path.display(),
                f.kind
            ));
            continue;
        }
        let at = cell_key(f);
        let cell = cells.entry(at).or_insert_with(|| Cell {
            rank: at.0,
            micro: at.1,
            ..Cell::default()
        });
        if let Some(msg) = read_into(map, f, cell, &mut conventions)? {
            unplaced.push(msg);
        }
    }
    Ok(StepDump {
        producer: name.to_string(),
        root: tree.root.clone(),
        step,
        cells: cells.into_values().collect(),
        conventions,
        unplaced,
    })
}

/// The files of `step` in `tree`.
///
/// Errors: none (naming the steps there are).
fn step_files(tree: &DumpTree, step: i64) -> Result<Vec<&DumpFile>> {
    let files: Vec<&DumpFile> = tree.files().iter().filter(|f| f.step == step).collect();
    if files.is_empty() {
        return Err(Error::input(
            &tree.root,
            format!(
                "no files of step {step} (steps there: {:?})",
                tree.steps().into_iter().collect::<Vec<_>>()
            ),
        ));
    }
    Ok(files)
}

/// The `(rank, micro)` cell a file's records land in (a file without a rank: rank 0).
fn cell_key(f: &DumpFile) -> (usize, Option<usize>) {
    (f.rank.unwrap_or(0) as usize, f.micro.map(|m| m as usize))
}

/// Read file `f` into `cell`; `Some(note)` when its producer's mapping holds nothing of it.
fn read_into(
    map: &dyn StepMapping,
    f: &DumpFile,
    cell: &mut Cell,
    conventions: &mut Conventions,
) -> Result<Option<String>> {
    let v = read_any(&f.path)?;
    cell.files.push(f.path.clone());
    Ok((!place(map, f, &v, cell, conventions)?).then(|| {
        format!(
            "{}: a {} file its producer's mapping holds nothing of",
            f.path.display(),
            f.kind
        )
    }))
}

/// Step `step` of the NexRL dump folder `root`, read cell by cell: the files are listed
/// now, each cell's files are read when the cell is asked for and released with it (the
/// memory of a step is that of the cells in flight). Cells and their contents are those
/// of [`read_step`]; the stated conventions and unplaced files are not gathered.
///
/// Errors: as [`read_step`] for the listing; reading a cell, as [`read_step`] for its files.
pub(crate) fn open_step(root: &Path, step: i64, name: &'static str) -> Result<TreeCells> {
    let tree = DumpTree::discover(root)?;
    let mut cells: BTreeMap<CellKey, Vec<DumpFile>> = BTreeMap::new();
    for f in step_files(&tree, step)? {
        if !matches!(f.kind, Kind::Param | Kind::Gradient) {
            cells.entry(cell_key(f)).or_default().push(f.clone());
        }
    }
    Ok(TreeCells {
        producer: name,
        kind: tree.producer,
        root: tree.root.clone(),
        step,
        cells: cells.into_iter().collect(),
    })
}

/// A cell's `(rank, micro)`.
type CellKey = (usize, Option<usize>);

/// A NexRL step whose cells are read on demand ([`open_step`]).
pub(crate) struct TreeCells {
    producer: &'static str,
    kind: crate::model::tree::Producer,
    root: std::path::PathBuf,
    step: i64,
    cells: Vec<(CellKey, Vec<DumpFile>)>,
}

impl StepCells for TreeCells {
    fn producer(&self) -> &str {
        self.producer
    }
    fn root(&self) -> &Path {
        &self.root
    }
    fn step(&self) -> i64 {
        self.step
    }
    fn keys(&self) -> Vec<(usize, Option<usize>)> {
        self.cells.iter().map(|(k, _)| *k).collect()
    }
    fn cell(&self, i: usize) -> Result<Cow<'_, Cell>> {
        let ((rank, micro), files) = &self.cells[i];
        let mut cell = Cell {
            rank: *rank,
            micro: *micro,
            ..Cell::default()
        };
        let mut conventions = Conventions::default();
        for f in files {
            read_into(mapping(self.kind), f, &mut cell, &mut conventions)?;
        }
        Ok(Cow::Owned(cell))
    }
}

/// Put what file `f` (read as `v`) holds into `cell` (and the conventions it states into
/// `conventions`); false when the mapping has no record of it.
fn place(
    map: &dyn StepMapping,
    f: &DumpFile,
    v: &Value,
    cell: &mut Cell,
    conventions: &mut Conventions,
) -> Result<bool> {
    map.conventions(f.kind, &f.path, v, conventions)?;
    if let Some(b) = map.cell_batch(f.kind, &f.path, v)? {
        merge(&mut cell.batch, b);
        return Ok(true);
    }
    if let Some(rec) = map.loss_record(f.kind, &f.path, v)? {
        cell.loss = Some(rec);
        return Ok(true);
    }
    if let Some(t) = map.trajectories(f.kind, &f.path, v)? {
        cell.batch.rows.extend(t.rows.iter().map(|r| RowMeta {
            group: r.group.clone(),
            sample: Some(r.index.to_string()),
            reward: r.reward,
            advantage: r.advantage,
            response_len: r.tokens.as_ref().map(|t| t.len()),
            ..RowMeta::default()
        }));
        return Ok(true);
    }
    Ok(false)
}

/// `from`'s tensors into `into` where `into` has none (a cell's files each hold some).
fn merge(into: &mut TokenBatch, from: TokenBatch) {
    for (k, t) in from.log_probs {
        into.log_probs.entry(k).or_insert(t);
    }
    let fill = |a: &mut Option<TokenTensor>, b: Option<TokenTensor>| {
        if a.is_none() {
            *a = b;
        }
    };
    fill(&mut into.entropy, from.entropy);
    fill(&mut into.response_mask, from.response_mask);
    fill(&mut into.input_ids, from.input_ids);
    fill(&mut into.attention_mask, from.attention_mask);
    fill(&mut into.advantages, from.advantages);
    fill(&mut into.loss_mask, from.loss_mask);
    fill(&mut into.ratio, from.ratio);
    fill(&mut into.per_token_loss, from.per_token_loss);
    fill(&mut into.token_rewards, from.token_rewards);
    fill(&mut into.importance_weights, from.importance_weights);
    fill(&mut into.response_ids, from.response_ids);
    if from.positions != TokenPositions::default() {
        into.positions = from.positions;
    }
    into.rows.extend(from.rows);
}
