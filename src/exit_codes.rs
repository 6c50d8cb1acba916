//! Exit codes shared by every command (SPEC §1).

/// Checked, and everything is clean.
pub const EXIT_CLEAN: u8 = 0;
/// Checked, and something is beyond tolerance or a finding reaches `--fail-on`.
pub const EXIT_FOUND: u8 = 1;
/// Usage error or unreadable input.
pub const EXIT_BAD_INPUT: u8 = 2;
