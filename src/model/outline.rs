//! What a path opened for inspection holds, as the inspector shows it: a dump tree's
//! layout, a whole-step producer's steps, or one file's own tree of values — each node a
//! line saying what it is (type, dtype, shape, small values or stats) with its children by
//! key — built below the model from the decoded file, before any producer maps it.

use std::path::PathBuf;

use crate::model::step::StepDump;
use crate::model::tree::DumpTree;

/// One value of a file: the line that says what it is, and its shown children by key.
#[derive(Debug, Clone, PartialEq)]
pub struct Outline {
    /// What the value is, in one line.
    pub line: String,
    /// Its shown children (dict entries, the first list items), by key.
    pub children: Vec<(String, Outline)>,
    /// List items not shown.
    pub hidden: usize,
}

/// A whole-step producer's tree: its reader's name, its steps and the first steps read.
pub struct StackView {
    /// The producer's reader (`verl`, `nemo-rl`, …).
    pub producer: String,
    /// Every step it holds.
    pub steps: Vec<i64>,
    /// The first steps, read into the model.
    pub read: Vec<(i64, StepDump)>,
}

/// What a path opened for inspection is.
pub enum Inspected {
    /// A NexRL dump tree.
    Tree(DumpTree),
    /// A tree or file of a whole-step producer.
    Stack {
        /// The path given.
        path: PathBuf,
        /// What its producer reads of it.
        view: StackView,
    },
    /// One file's own values.
    File {
        /// The path given.
        path: PathBuf,
        /// Its size in bytes; `None` for a stream.
        size: Option<u64>,
        /// Its values.
        outline: Outline,
    },
}
