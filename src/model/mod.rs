//! The typed records every tool reads, below the readers: a step's trajectories and
//! datums, its per-token batches (log-prob sources, entropy, masks, with dtype and
//! provenance), loss records and parameters; a log's records and a finding. Producers
//! map their files into these in one place each ([`crate::producers`]).
//! Nothing here imports a reader, a detector, a tool or a renderer.

pub mod conventions;
pub mod finding;
pub mod log;
pub mod outline;
pub mod record;
pub mod rows;
pub mod step;
pub mod tokens;
pub mod trajectory;
pub mod tree;
pub mod unreadable;
