//! The typed records every tool reads, below the readers: a log's records and a finding.
//! Nothing here imports a reader, a detector, a tool or a renderer.

pub mod finding;
pub mod log;
