//! The one integration-test binary (one link, like ripgrep's tests/tests.rs); one module per area.
mod dumps;
mod arrays;
mod cli;
mod pt;
mod logscan;
mod dumpdiff;
mod losscheck;
mod postmortem;
