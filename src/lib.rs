//! # rlforensics
//!
//! Offline forensics for GRPO/GSPO post-training runs. Reads, without torch, the tensor
//! dumps (`.pt`, `.safetensors`, `.npy`/`.npz`, one-line `.jsonl`) and logs a run leaves
//! on disk, maps each producer's files into one typed model of a step ([`model`], through
//! [`producers`]), and normalises them into polars frames ([`frames`]).
//!
//! Layers point down only: [`model`] ← [`formats`], [`logs`] ← [`producers`] ←
//! [`compare`], [`kernels`], [`detect`] ← [`judge`] ← the tools ([`logscan`], [`dumpdiff`],
//! [`losscheck`], [`postmortem`]) ← [`render`] ← [`cli`] and the binaries.
//!
//! Every normalised table of a dump tree is a [`polars::frame::DataFrame`]: `scalars`
//! (one row per number of a file), `tokens` (one row per file × row × position, one
//! column per per-token tensor) and `trajectories` (one row per trajectory or datum):
//!
//! ```no_run
//! use rlforensics::frames::build_frames;
//! use rlforensics::producers::layout::DumpTree;
//!
//! let tree = DumpTree::discover("fixtures/dumps/self_hosted_pt".as_ref())?;
//! let frames = build_frames(&tree, Some(0))?;
//! let tokens: &polars::frame::DataFrame = &frames.tokens;
//! println!("{}", tokens.head(Some(5)));
//! println!("{} trajectories", frames.trajectories.height());
//! for (name, df) in frames.tables() {
//!     println!("{name}: {:?}", df.get_column_names());
//! }
//! # Ok::<(), rlforensics::Error>(())
//! ```
//!
//! The typed records behind them, one producer mapping per layout:
//!
//! ```no_run
//! use rlforensics::formats;
//! use rlforensics::producers::{layout::{DumpTree, Kind}, nexrl_self_hosted};
//!
//! let tree = DumpTree::discover("fixtures/dumps/self_hosted_pt".as_ref())?;
//! if let Some(f) = tree.get(Kind::Trajectory, 0, None, None) {
//!     let value = formats::read_any(&f.path)?;
//!     for t in nexrl_self_hosted::trajectories(&f.path, &value)?.rows {
//!         println!("{} {:?} {:?}", t.index, t.reward, t.group);
//!     }
//! }
//! # Ok::<(), rlforensics::Error>(())
//! ```

pub mod cli;
pub mod compare;
pub mod conventions;
pub mod detect;
pub mod dumpdiff;
pub mod error;
pub mod exit_codes;
pub mod fmt;
pub mod formats;
pub mod frames;
pub mod inspect;
pub mod json;
pub mod judge;
pub mod kernels;
pub mod logs;
pub mod logscan;
pub mod losscheck;
pub mod mismatch;
pub mod model;
pub mod postmortem;
pub mod producers;
pub mod render;
pub mod tensor;
pub mod value;

pub use error::{Error, FormatError, Position, Result};
pub use tensor::{DType, Tensor};
pub use value::Value;
