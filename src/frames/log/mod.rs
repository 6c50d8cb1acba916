//! The per-step frame of canonical metrics logscan's detectors read: columns built from
//! [`crate::model::log::LogRecord`]s with the metric aliases of [`crate::logs::aliases`].

pub mod column;
pub mod frame;
pub mod series;
