//! Log readers: a run's `steps.jsonl` / `events.jsonl` (`fastline` is their fast path),
//! free-text training logs (`textlog`), experiment trackers (`trackers`: TensorBoard,
//! W&B, MLflow, Trackio, CSV), key aliases and crash bundles, each read into
//! [`crate::model::log`] records.

pub mod aliases;
pub mod completions;
pub mod crash_bundle;
pub mod events;
pub mod fastline;
pub mod fetch_dir;
pub mod input;
pub mod logged;
pub mod steps;
pub mod textlog;
pub mod trackers;
