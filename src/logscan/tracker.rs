//! Tracker files into the frame: one thread reads and decodes the file while this one
//! folds its rows into the frame builder.

use std::io::Read;
use std::path::Path;

use crate::error::Result;
use crate::frames::log::frame::FrameBuilder;
use crate::model::log::FileStats;

/// Read tracker file `path` into `builder`: the file is read and decoded on a second
/// thread while this one folds its batches of rows into the frame (keys renamed with
/// [`crate::logs::trackers::canonical_key`] and interned once per file). A `.wandb`
/// file's config records are kept in `configs` when given.
pub fn read_tracker(
    builder: &mut FrameBuilder,
    kind: crate::logs::trackers::TrackerKind,
    path: &Path,
    input: impl Read + Send,
    run: Option<&str>,
    configs: Option<&mut Vec<crate::logs::trackers::wandb::ConfigRecord>>,
) -> Result<FileStats> {
    use crate::logs::trackers::{self, rows::RowBatch};
    // Batches in flight: the reader runs at most this far ahead of the fold.
    const QUEUE: usize = 4;
    let mut gmap: Vec<u32> = Vec::new();
    // The batch's key ids become the builder's in place (the batch goes back to the
    // reader, which clears it): no copy of each row's fields.
    let mut fold = |batch: &mut RowBatch| {
        for name in &batch.new_keys {
            let k = trackers::canonical_key(builder.aliases(), name);
            gmap.push(builder.intern(&k));
        }
        for f in &mut batch.fields {
            f.0 = gmap.get(f.0 as usize).copied().unwrap_or(u32::MAX);
        }
        let mut at = 0usize;
        for h in &batch.rows {
            let n = h.fields as usize;
            let fields = batch.fields.get(at..at + n).unwrap_or_default();
            at += n;
            builder.push_ids(h.step, h.timestamp, h.source, fields);
        }
    };
    // Inside a rayon worker (a caller scanning in parallel), read on this thread: a
    // worker blocked on the channel would hold a pool thread the reader's parallel parse
    // may be waiting for.
    if rayon::current_thread_index().is_some() {
        return trackers::read_rows_keeping(
            kind,
            path,
            input,
            run,
            &mut |mut b| {
                fold(&mut b);
                Some(b)
            },
            configs,
        );
    }
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<RowBatch>(QUEUE);
        // Folded batches go back to the reader to be refilled.
        let (back_tx, back_rx) = std::sync::mpsc::sync_channel::<RowBatch>(QUEUE + 2);
        let reader = s.spawn(move || {
            trackers::read_rows_keeping(
                kind,
                path,
                input,
                run,
                &mut |b| {
                    // The receiver lives until this thread is joined.
                    let _ = tx.send(b);
                    back_rx.try_recv().ok()
                },
                configs,
            )
        });
        for mut b in rx {
            fold(&mut b);
            let _ = back_tx.try_send(b);
        }
        match reader.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}
