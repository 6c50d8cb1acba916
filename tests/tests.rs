//! The one integration-test binary (one link, like ripgrep's tests/tests.rs); one module per area.
mod arrays;
mod cli;
mod corpus;
mod dumpdiff;
mod dumps;
mod hardening;
mod layers;
mod logscan;
mod losscheck;
mod packed;
mod postmortem;
mod pt;
mod real_logs;
mod render;
mod scenarios;
mod scenarios_losscheck;
mod trackers;
