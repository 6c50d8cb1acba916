//! A dump tree as tools see it: its files by kind and step/rank/micro coordinates, who
//! wrote it, and how each file is read into a [`Record`]. Producers find and place the
//! files (`crate::producers::layout`); tools only query the tree and read records through
//! it, never a file's bytes or its producer's keys.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::model::conventions::Conventions;
use crate::model::record::Record;
use crate::model::step::LossRecord;
use crate::model::trajectory::{DatumBatch, TrajectoryBatch, TrajectorySummary};

/// The on-disk formats a dump file may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    Pt,
    Jsonl,
    Safetensors,
    Npy,
    Npz,
}

impl FileFormat {
    /// The format implied by a file name's extension.
    pub fn from_path(path: &Path) -> Option<FileFormat> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "pt" | "pth" => FileFormat::Pt,
            "jsonl" | "json" => FileFormat::Jsonl,
            "safetensors" => FileFormat::Safetensors,
            "npy" => FileFormat::Npy,
            "npz" => FileFormat::Npz,
            _ => return None,
        })
    }

    /// The usual extension, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            FileFormat::Pt => "pt",
            FileFormat::Jsonl => "jsonl",
            FileFormat::Safetensors => "safetensors",
            FileFormat::Npy => "npy",
            FileFormat::Npz => "npz",
        }
    }
}

/// The folders a dump tree may hold, one per kind of record (SPEC §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Trajectory,
    OldLogProbs,
    ForwardData,
    Loss,
    Param,
    Gradient,
    PreparedTrajectories,
    Datums,
    TrainingMetrics,
    IsLossDebug,
    BatchInputs,
}

impl Kind {
    /// Every kind, in the order reports list them.
    pub const ALL: [Kind; 11] = [
        Kind::Trajectory,
        Kind::PreparedTrajectories,
        Kind::Datums,
        Kind::OldLogProbs,
        Kind::ForwardData,
        Kind::Loss,
        Kind::IsLossDebug,
        Kind::BatchInputs,
        Kind::TrainingMetrics,
        Kind::Param,
        Kind::Gradient,
    ];

    /// The folder name the producers use.
    pub fn dir_name(self) -> &'static str {
        match self {
            Kind::Trajectory => "trajectory",
            Kind::OldLogProbs => "old_log_probs",
            Kind::ForwardData => "forward_data",
            Kind::Loss => "loss",
            Kind::Param => "param",
            Kind::Gradient => "gradient",
            Kind::PreparedTrajectories => "prepared_trajectories",
            Kind::Datums => "datums",
            Kind::TrainingMetrics => "training_metrics",
            Kind::IsLossDebug => "is_loss_debug",
            Kind::BatchInputs => "batch_inputs",
        }
    }

    /// The kind stored in a folder of this name.
    pub fn from_dir_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.dir_name() == name)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dir_name())
    }
}

/// Which trainer wrote a dump tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Producer {
    /// NexRL's self-hosted trainer: trajectory, old_log_probs, forward_data, loss, param, gradient.
    SelfHosted,
    /// NexRL in remote-API mode: prepared_trajectories, datums, training_metrics.
    RemoteApi,
    /// The weaver trainer: forward_data, loss, is_loss_debug, batch_inputs, per-micro param/gradient.
    Weaver,
    /// Not enough distinctive files to tell (e.g. forward_data and loss only).
    Unknown,
}

impl fmt::Display for Producer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Producer::SelfHosted => "self-hosted",
            Producer::RemoteApi => "remote-api",
            Producer::Weaver => "weaver",
            Producer::Unknown => "unknown",
        })
    }
}

/// One dump file and the coordinates parsed from its name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DumpFile {
    /// Full path.
    pub path: PathBuf,
    /// The kind folder it sits in.
    pub kind: Kind,
    /// Training step (may be negative: `step_-00001`).
    pub step: i64,
    /// Rank, for per-rank files.
    pub rank: Option<u32>,
    /// Micro-batch index, for per-micro files.
    pub micro: Option<u32>,
    /// File format, from the extension.
    pub format: FileFormat,
    /// Size in bytes.
    pub size: u64,
}

/// A file in a kind folder whose name is not `step_N[_rankR][_microM].ext`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Unrecognised {
    /// Full path.
    pub path: PathBuf,
    /// Why it was not taken.
    pub reason: String,
}

/// Everything found under one dump root.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DumpTree {
    /// The folder holding the kind folders.
    pub root: PathBuf,
    /// Who wrote it.
    pub producer: Producer,
    /// Files sorted by (kind, step, rank, micro, format).
    files: Vec<DumpFile>,
    /// Files in kind folders that could not be placed.
    pub unrecognised: Vec<Unrecognised>,
    /// How its producer reads its files into the model.
    #[serde(skip)]
    reader: &'static dyn FileReader,
}

/// How a producer reads the files of its tree into the model: the door every tool reads a
/// dump file through. A tool names fields by meaning ([`crate::model::record::Field`]),
/// the producer by key; the tool gets typed records, never a file's bytes or keys.
pub trait FileReader: Sync + Send {
    /// One file read into a record (every tensor key it reads lazily checked for type).
    fn record(&self, file: &DumpFile) -> Result<Record>;
    /// A whole-batch file read into a record whose tensors stay in the file's memory map,
    /// released from memory once read ([`crate::model::record::Pages`]); [`Self::record`]
    /// when the file cannot be mapped.
    fn whole(&self, file: &DumpFile) -> Result<Record> {
        self.record(file)
    }
    /// A trajectory file read as [`Self::whole`], with its trajectories summarised as they
    /// are read when the producer can (then the record's trajectory list is emptied).
    fn summarised(&self, file: &DumpFile) -> Result<(Record, Option<TrajectorySummary>)> {
        Ok((self.whole(file)?, None))
    }
    /// The trajectories a record of `file` holds.
    fn trajectories<'r>(&self, file: &DumpFile, r: &'r Record) -> Result<TrajectoryBatch<'r>>;
    /// The datums a record of `file` holds.
    fn datums<'r>(&self, file: &DumpFile, r: &'r Record) -> Result<DatumBatch<'r>>;
    /// The loss record (terms, echoed coefficients, metrics) a record of `file` holds.
    fn loss(&self, file: &DumpFile, r: &Record) -> Result<LossRecord>;
    /// The conventions a record of `file` states (aggregation, loss scale, coefficients),
    /// each with where it was read.
    fn conventions(&self, file: &DumpFile, r: &Record) -> Result<Conventions>;
}

impl fmt::Debug for dyn FileReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FileReader")
    }
}

impl DumpTree {
    /// The tree of `files` under `root` (sorted here by kind, step, rank, micro, format),
    /// written by `producer`, whose files `reader` reads.
    pub fn new(
        root: PathBuf,
        producer: Producer,
        mut files: Vec<DumpFile>,
        mut unrecognised: Vec<Unrecognised>,
        reader: &'static dyn FileReader,
    ) -> DumpTree {
        files.sort_by(|a, b| {
            (a.kind, a.step, a.rank, a.micro, a.format)
                .cmp(&(b.kind, b.step, b.rank, b.micro, b.format))
        });
        unrecognised.sort_by(|a, b| a.path.cmp(&b.path));
        DumpTree {
            root,
            producer,
            files,
            unrecognised,
            reader,
        }
    }

    /// One of this tree's files read into a record by its producer ([`FileReader::record`]).
    ///
    /// Errors: the file cannot be read or holds a field of the wrong type (named with the file).
    pub fn read(&self, file: &DumpFile) -> Result<Record> {
        self.reader.record(file)
    }

    /// How its producer reads its files into the model.
    pub fn reader(&self) -> &'static dyn FileReader {
        self.reader
    }

    /// The tree without the files in `paths` (e.g. files found unreadable, so that
    /// every other cell can still be compared); the removed files are returned.
    pub fn without(mut self, paths: &(dyn Fn(&Path) -> bool + Sync)) -> (DumpTree, Vec<DumpFile>) {
        let (gone, kept) = self.files.into_iter().partition(|f| paths(&f.path));
        self.files = kept;
        (self, gone)
    }

    /// Every placed file, sorted by (kind, step, rank, micro, format).
    pub fn files(&self) -> &[DumpFile] {
        &self.files
    }

    /// The kinds that have at least one file.
    pub fn kinds(&self) -> BTreeSet<Kind> {
        self.files.iter().map(|f| f.kind).collect()
    }

    /// The steps present, over all kinds, ascending.
    pub fn steps(&self) -> BTreeSet<i64> {
        self.files.iter().map(|f| f.step).collect()
    }

    /// The files of one kind at one step.
    pub fn files_of(&self, kind: Kind, step: i64) -> impl Iterator<Item = &DumpFile> {
        self.files
            .iter()
            .filter(move |f| f.kind == kind && f.step == step)
    }

    /// The ranks present for a kind at a step, ascending by number.
    pub fn ranks(&self, kind: Kind, step: i64) -> BTreeSet<u32> {
        self.files_of(kind, step).filter_map(|f| f.rank).collect()
    }

    /// The micro indices present for a kind at a step.
    pub fn micros(&self, kind: Kind, step: i64) -> BTreeSet<u32> {
        self.files_of(kind, step).filter_map(|f| f.micro).collect()
    }

    /// The file for exact coordinates, if present (first format when several exist).
    pub fn get(
        &self,
        kind: Kind,
        step: i64,
        rank: Option<u32>,
        micro: Option<u32>,
    ) -> Option<&DumpFile> {
        self.files_of(kind, step)
            .find(|f| f.rank == rank && f.micro == micro)
    }

    /// For per-rank-per-micro kinds: the (rank, micro) cells missing from the full grid of
    /// ranks × micros seen for that kind and step — holes the user should know about.
    pub fn missing_cells(&self, kind: Kind, step: i64) -> Vec<(u32, u32)> {
        let ranks = self.ranks(kind, step);
        let micros = self.micros(kind, step);
        let have: BTreeSet<(u32, u32)> = self
            .files_of(kind, step)
            .filter_map(|f| Some((f.rank?, f.micro?)))
            .collect();
        ranks
            .iter()
            .flat_map(|&r| micros.iter().map(move |&m| (r, m)))
            .filter(|c| !have.contains(c))
            .collect()
    }

    /// Number of files per kind.
    pub fn counts(&self) -> BTreeMap<Kind, usize> {
        let mut m = BTreeMap::new();
        for f in &self.files {
            *m.entry(f.kind).or_default() += 1;
        }
        m
    }

    /// Total bytes of all placed files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}
