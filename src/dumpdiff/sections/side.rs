//! One side's dump tree at the compared step: whole-batch files read up front, per-rank
//! files read by the cell that needs them.

use super::*;

/// One side's tree and its files at the compared step. Whole-batch files are parsed up
/// front and kept; per-rank files are only listed, and read by the cell that compares them
/// ([`SideData::fetch`]) and dropped with it, so memory follows one cell, not the tree.
pub struct SideData {
    /// The flag it came from: `self-hosted`, `remote-api`, `weaver`.
    pub role: &'static str,
    /// Its discovered layout.
    pub tree: DumpTree,
    /// Whole-batch files (no rank in the name), read up front, by path.
    pub values: HashMap<PathBuf, Record>,
    /// Per-rank files of the step (after the rank/micro filters), read on demand: path → size.
    pub streamed: HashMap<PathBuf, u64>,
    /// The compared step.
    pub step: i64,
    /// Streamed files read so far.
    read: Mutex<HashSet<PathBuf>>,
    /// The file at each (kind, rank, micro) of the step, as [`DumpTree::get`] picks it.
    index: HashMap<(Kind, Option<u32>, Option<u32>), usize>,
}

impl SideData {
    /// A side whose `values` are read and whose `streamed` files will be.
    pub fn new(
        role: &'static str,
        tree: DumpTree,
        values: HashMap<PathBuf, Record>,
        streamed: HashMap<PathBuf, u64>,
        step: i64,
    ) -> Self {
        let mut index = HashMap::new();
        for (i, f) in tree.files().iter().enumerate() {
            if f.step == step {
                // The first file of a coordinate wins, as in `DumpTree::get`.
                index.entry((f.kind, f.rank, f.micro)).or_insert(i);
            }
        }
        SideData {
            role,
            tree,
            values,
            streamed,
            step,
            read: Mutex::new(HashSet::new()),
            index,
        }
    }

    /// The file of `kind` at (rank, micro) of the compared step (what `tree.get` finds).
    pub(crate) fn file(
        &self,
        kind: Kind,
        rank: Option<u32>,
        micro: Option<u32>,
    ) -> Option<&DumpFile> {
        let &i = self.index.get(&(kind, rank, micro))?;
        self.tree.files().get(i)
    }

    /// The whole-batch record of `kind` at (rank, micro), if that file exists.
    pub fn get(&self, kind: Kind, rank: Option<u32>, micro: Option<u32>) -> Option<&Record> {
        let f = self.file(kind, rank, micro)?;
        self.values.get(&f.path)
    }

    /// [`SideData::get`] with its file, for reading through the tree's reader and for
    /// messages that name it.
    pub fn get_file(
        &self,
        kind: Kind,
        rank: Option<u32>,
        micro: Option<u32>,
    ) -> Option<(&DumpFile, &Record)> {
        let f = self.file(kind, rank, micro)?;
        Some((f, self.values.get(&f.path)?))
    }

    /// The trajectories of the whole-batch file of `kind` (trajectory, prepared
    /// trajectories), through the tree's reader; `None` without such a file.
    ///
    /// Errors: the file's trajectories unreadable (named with the file).
    pub fn trajectories(&self, kind: Kind) -> Result<Option<TrajectoryBatch<'_>>> {
        self.get_file(kind, None, None)
            .map(|(f, r)| self.tree.reader().trajectories(f, r))
            .transpose()
    }

    /// The datums of the whole-batch `datums/` file, through the tree's reader.
    ///
    /// Errors: the file's datums unreadable (named with the file).
    pub fn datums(&self) -> Result<Option<DatumBatch<'_>>> {
        self.get_file(Kind::Datums, None, None)
            .map(|(f, r)| self.tree.reader().datums(f, r))
            .transpose()
    }

    /// The loss record (terms, echoed coefficients) of this side's `loss/` record `r` at
    /// (rank, micro), through the tree's reader; `None` without that file.
    pub fn loss_record(
        &self,
        rank: u32,
        micro: Option<u32>,
        r: &Record,
    ) -> Option<Result<LossRecord>> {
        let f = self.file(Kind::Loss, Some(rank), micro)?;
        Some(self.tree.reader().loss(f, r))
    }

    /// The conventions this side's `loss/` record `r` at (rank, micro) states (echoed
    /// aggregation, loss scale, coefficients); `None` without that file or when unreadable.
    pub fn loss_conventions(
        &self,
        rank: u32,
        micro: Option<u32>,
        r: &Record,
    ) -> Option<Conventions> {
        let f = self.file(Kind::Loss, Some(rank), micro)?;
        self.tree.reader().conventions(f, r).ok()
    }

    /// Whether `path` is one of this side's files at the compared step.
    pub fn has(&self, path: &Path) -> bool {
        self.values.contains_key(path) || self.streamed.contains_key(path)
    }

    /// The file of `kind` at (rank, micro): borrowed when read up front, else read now
    /// (the caller drops it when its cell is done). `None` when there is no such file.
    pub fn fetch(
        &self,
        kind: Kind,
        rank: Option<u32>,
        micro: Option<u32>,
        progress: &dyn Progress,
    ) -> Result<Option<Cow<'_, Record>>> {
        let Some(f) = self.file(kind, rank, micro) else {
            return Ok(None);
        };
        if let Some(v) = self.values.get(&f.path) {
            return Ok(Some(Cow::Borrowed(v)));
        }
        let Some(&size) = self.streamed.get(&f.path) else {
            return Ok(None);
        };
        let v = self.tree.read(f)?;
        progress.file_done(size);
        self.read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(f.path.clone());
        Ok(Some(Cow::Owned(v)))
    }

    /// The streamed files read so far, with their sizes, forgotten here (the work done
    /// ahead hands them to the side it was done for: [`SideData::mark_read`]).
    pub fn take_read(&self) -> Vec<(PathBuf, u64)> {
        let read = std::mem::take(&mut *self.read.lock().unwrap_or_else(|e| e.into_inner()));
        let mut out: Vec<(PathBuf, u64)> = read
            .into_iter()
            .map(|p| {
                let size = self.streamed.get(&p).copied().unwrap_or(0);
                (p, size)
            })
            .collect();
        out.sort();
        out
    }

    /// Count `path` as read (by work done ahead on another [`SideData`] of this tree).
    pub fn mark_read(&self, path: PathBuf) {
        self.read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path);
    }

    /// Read (and drop) every streamed file no cell has read, so that an unreadable file
    /// fails the run whether or not a section needed it. A file in `prechecked` (read
    /// earlier by [`precheck`]) is not read again: its recorded outcome stands.
    pub fn check_unread(
        &self,
        progress: &dyn Progress,
        prechecked: &mut HashMap<PathBuf, Result<()>>,
    ) -> Result<()> {
        let unread: Vec<&DumpFile> = {
            let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
            self.tree
                .files()
                .iter()
                .filter(|f| self.streamed.contains_key(&f.path) && !read.contains(&f.path))
                .collect()
        };
        let mut rest = Vec::with_capacity(unread.len());
        for f in unread {
            match prechecked.remove(&f.path) {
                Some(outcome) => {
                    outcome?;
                    progress.file_done(f.size);
                }
                None => rest.push(f),
            }
        }
        rest.par_iter().try_for_each(|f| {
            self.tree.read(f)?;
            progress.file_done(f.size);
            Ok(())
        })
    }

    /// Files of the compared step (read up front or streamed).
    pub fn files_read(&self) -> usize {
        self.values.len() + self.streamed.len()
    }

    /// Their bytes.
    pub fn bytes_read(&self) -> u64 {
        self.tree
            .files()
            .iter()
            .filter(|f| self.has(&f.path))
            .map(|f| f.size)
            .sum()
    }
}

/// Read (and drop) each of `files` of `tree` in turn, as [`SideData::check_unread`]
/// would, and return each outcome by path; stops early when `stop` is set. Run on a thread of its own while
/// the whole-batch files are read (a phase that leaves a core idle) for the files no cell
/// is expected to read; those it has not reached when it is joined are checked then, in
/// parallel ([`SideData::check_unread`]).
pub fn precheck(
    tree: &DumpTree,
    files: &[DumpFile],
    stop: &std::sync::atomic::AtomicBool,
) -> HashMap<PathBuf, Result<()>> {
    let mut out = HashMap::new();
    for f in files {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        out.insert(f.path.clone(), tree.read(f).map(drop));
    }
    out
}
