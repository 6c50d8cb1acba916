//! How NexRL's trees (self-hosted, remote-API, weaver) are read into the model's records
//! ([`FileReader`]): each file decoded and its fields named by
//! [`field_name`]; whole-batch `.pt` files (`old_log_probs/step_N.pt`,
//! trajectories) kept in their memory map and released from memory once parsed, so that
//! only the rows a cell is reading stay resident; a trajectory file digested trajectory by
//! trajectory as the unpickler builds them.

use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::formats::pt::pickle::Each;
use crate::formats::{read_any, FileFormat};
use crate::model::conventions::Conventions;
use crate::model::record::{Field, Pages, Record};
use crate::model::step::LossRecord;
use crate::model::trajectory::{DatumBatch, TrajectoryBatch, TrajectoryRow, TrajectorySummary};
use crate::model::tree::{DumpFile, FileReader};
use crate::producers::{check_tensor_keys, nexrl_self_hosted, remote_api, weaver};
use crate::value::Value;

/// How NexRL's trainers (self-hosted, weaver, remote-API) name each field of a dumped
/// record: one key space across their `forward_data/`, `old_log_probs/`, `is_loss_debug/`,
/// `batch_inputs/`, `loss/`, `param/` and `gradient/` files.
pub fn field_name(f: Field) -> Option<&'static str> {
    Some(match f {
        Field::InputIds => nexrl_self_hosted::INPUT_IDS,
        Field::AttentionMask => weaver::ATTENTION_MASK,
        Field::ResponseMask => nexrl_self_hosted::RESPONSE_MASK,
        Field::EffectiveMask => weaver::EFFECTIVE_VALID,
        Field::LogProbs => nexrl_self_hosted::LOG_PROBS,
        Field::OldLogProbs => nexrl_self_hosted::OLD_LOG_PROBS,
        Field::RefLogProbs => nexrl_self_hosted::REF_LOG_PROBS,
        Field::RolloutLogProbs => weaver::ROLLOUT_LOG_PROBS,
        Field::Entropy => nexrl_self_hosted::ENTROPY,
        Field::Advantages => nexrl_self_hosted::ADVANTAGES,
        Field::ProbRatio => weaver::PROB_RATIO,
        Field::ElementwiseLoss => weaver::ELEMENTWISE_LOSS,
        Field::Param => nexrl_self_hosted::PARAM,
        Field::Gradient => nexrl_self_hosted::GRADIENT,
        Field::Loss => nexrl_self_hosted::LOSS,
        Field::PgLoss => nexrl_self_hosted::PG_LOSS,
        Field::EntropyLoss => nexrl_self_hosted::ENTROPY_LOSS,
        Field::KlLoss => nexrl_self_hosted::KL_METRICS[1],
    })
}

/// The reader of every NexRL tree: the three trainers share one key space.
pub struct NexrlFiles;

impl FileReader for NexrlFiles {
    fn record(&self, file: &DumpFile) -> Result<Record> {
        let v = read_any(&file.path)?;
        check_tensor_keys(file.kind, &file.path, &v)?;
        Ok(Record::new(v, field_name))
    }

    fn whole(&self, file: &DumpFile) -> Result<Record> {
        let (v, pages) = read_whole(&file.path)?;
        check_tensor_keys(file.kind, &file.path, &v)?;
        Ok(with_pages(v, pages))
    }

    fn summarised(&self, file: &DumpFile) -> Result<(Record, Option<TrajectorySummary>)> {
        let (v, pages, summary) = read_trajectory_summary(&file.path)?;
        check_tensor_keys(file.kind, &file.path, &v)?;
        Ok((with_pages(v, pages), summary))
    }

    fn trajectories<'r>(&self, file: &DumpFile, r: &'r Record) -> Result<TrajectoryBatch<'r>> {
        nexrl_self_hosted::trajectories(&file.path, r.raw())
    }

    fn datums<'r>(&self, file: &DumpFile, r: &'r Record) -> Result<DatumBatch<'r>> {
        remote_api::datums(&file.path, r.raw())
    }

    fn loss(&self, file: &DumpFile, r: &Record) -> Result<LossRecord> {
        nexrl_self_hosted::loss_record(&file.path, r.raw())
    }

    fn conventions(&self, file: &DumpFile, r: &Record) -> Result<Conventions> {
        let mut c = Conventions::default();
        nexrl_self_hosted::loss_conventions(file.kind, &file.path, r.raw(), &mut c)?;
        Ok(c)
    }
}

/// A decoded file as a record, with the map it was read from.
fn with_pages(v: Value, pages: Option<Pages>) -> Record {
    let r = Record::new(v, field_name);
    match pages {
        Some(p) => r.with_pages(p),
        None => r,
    }
}

/// The memory map of a non-empty regular `.pt` file; `None` for any other file, which is
/// read without a map.
fn map_pt(path: &Path) -> Result<Option<Arc<Mmap>>> {
    if crate::formats::source::is_remote(path) {
        return Ok(None); // an object in a store: fetched by `read_any`, no map
    }
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if FileFormat::from_path(path) != Some(FileFormat::Pt) || !meta.is_file() || meta.len() == 0 {
        return Ok(None);
    }
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: as in `formats::open_input`: the map is read-only and this crate never
    // writes input files; another process truncating the file while we read is not
    // defended, as with every memory map.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    Ok(Some(Arc::new(map)))
}

/// Read a whole-batch dump file. A `.pt` regular file is mapped here, parsed (every member
/// CRC-checked, as [`read_any`] does) and then released from memory: the map is returned
/// for the caller to keep. Anything else is [`read_any`] with no map.
pub fn read_whole(path: &Path) -> Result<(Value, Option<Pages>)> {
    let Some(map) = map_pt(path)? else {
        return Ok((read_any(path)?, None));
    };
    let value = crate::formats::pt::read_pt_map(map.clone()).map_err(|e| e.in_file(path))?;
    let pages = Pages::new(map);
    // The CRC check touched every page; each cell faults back in the rows it reads.
    pages.release_all();
    Ok((value, Some(pages)))
}

/// Batches of trajectories handed to the digesting thread and not yet digested, at most:
/// with [`DIGEST_BATCH`], a bound on the memory they hold (a few MB at 8k tokens each).
const DIGEST_QUEUE: usize = 4;

/// Trajectories handed over together: one wake-up of the digesting thread per batch, not
/// per trajectory (a step's 1,536 hand-overs cost ~10 µs of futex and scheduling each).
const DIGEST_BATCH: usize = 8;

/// Read a `trajectory/` file summarised as it is read: each trajectory is digested
/// ([`TrajectoryRow::of`]) as soon as the unpickler has built it and its token lists
/// freed, so that memory does not grow with the number of trajectories. Returns the value
/// (its `trajectories` items replaced by `None`), the map, and the summary — `None` when
/// the file has no `trajectories` list, as [`TrajectorySummary::of`] would say. Files
/// this cannot digest item by item (not a `.pt` file, items not appended one batch at a
/// time, an item referenced twice) are read whole and summarised afterwards.
pub fn read_trajectory_summary(
    path: &Path,
) -> Result<(Value, Option<Pages>, Option<TrajectorySummary>)> {
    let whole = |path: &Path| -> Result<(Value, Option<Pages>, Option<TrajectorySummary>)> {
        let (v, pages) = read_whole(path)?;
        let s = match v.get(nexrl_self_hosted::TRAJECTORIES) {
            None => None,
            Some(_) => Some(TrajectorySummary::of(&nexrl_self_hosted::trajectories(
                path, &v,
            )?)),
        };
        Ok((v, pages, s))
    };
    let Some(map) = map_pt(path)? else {
        return whole(path);
    };
    // The unpickler (this thread) hands each trajectory to a second thread that digests
    // and frees it, so that the two run side by side on a step's largest file. The worker
    // stops at the first trajectory it cannot digest; the read then fails at the next
    // hand-over and the file is read whole, as when the hook refused it in place.
    let (read, rows) = std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<(usize, Value)>>(DIGEST_QUEUE);
        let worker = scope.spawn(move || -> std::result::Result<Vec<TrajectoryRow>, String> {
            let mut rows = Vec::new();
            for (i, t) in rx.into_iter().flatten() {
                let row =
                    nexrl_self_hosted::trajectory(path, i, &t, None).map_err(|e| e.to_string())?;
                rows.push(TrajectoryRow::of(&row));
            }
            Ok(rows)
        });
        let mut batch = Vec::with_capacity(DIGEST_BATCH);
        let stopped = |_| "trajectory digest stopped".to_string();
        let mut each = |i: usize, t: Value| -> std::result::Result<Value, String> {
            batch.push((i, t));
            if batch.len() == DIGEST_BATCH {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(DIGEST_BATCH));
                tx.send(full).map_err(stopped)?;
            }
            Ok(Value::None)
        };
        let read = crate::formats::pt::read_pt_map_each(
            map.clone(),
            Each {
                key: nexrl_self_hosted::TRAJECTORIES,
                each: &mut each,
            },
        );
        // The last, partial batch. A send fails only when the worker stopped at a
        // trajectory it could not digest: its error then sends the file to `whole` below.
        if read.is_ok() && !batch.is_empty() {
            let _ = tx.send(batch);
        }
        drop(tx);
        let rows = worker
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (read, rows)
    });
    let (Ok(rows), Ok(value)) = (rows, read) else {
        return whole(path);
    };
    let pages = Pages::new(map);
    pages.release_all();
    match value
        .get(nexrl_self_hosted::TRAJECTORIES)
        .and_then(Value::as_seq)
    {
        None => Ok((value, Some(pages), None)),
        Some(items)
            if items.len() == rows.len() && items.iter().all(|t| matches!(t, Value::None)) =>
        {
            let s = TrajectorySummary {
                file: path.to_path_buf(),
                rows,
            };
            Ok((value, Some(pages), Some(s)))
        }
        Some(_) => whole(path),
    }
}
