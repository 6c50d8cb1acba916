//! # rlforensics
//!
//! Offline forensics for GRPO/GSPO post-training runs. Reads, without torch, the tensor
//! dumps (`.pt`, `.safetensors`, `.npy`/`.npz`, one-line `.jsonl`) and logs a run leaves
//! on disk, and normalises them into polars frames.
//!
//! ```no_run
//! use rlforensics::readers::{self, layout::DumpTree};
//! let tree = DumpTree::discover("fixtures/dumps/self_hosted_pt".as_ref()).unwrap();
//! for file in tree.files() {
//!     let value = readers::read_any(&file.path).unwrap();
//!     println!("{} {:?}", file.path.display(), value.type_name());
//! }
//! ```

pub mod alloc;
pub mod cli;
pub mod compare;
pub mod conventions;
pub mod detect;
pub mod dumpdiff;
pub mod error;
pub mod exit_codes;
pub mod fmt;
pub mod frames;
pub mod inspect;
pub mod json;
pub mod kernels;
pub mod logscan;
pub mod losscheck;
pub mod model;
pub mod postmortem;
pub mod readers;
pub mod render;
pub mod tensor;
pub mod value;

pub use error::{Error, FormatError, Position, Result};
pub use tensor::{DType, Tensor};
pub use value::Value;
