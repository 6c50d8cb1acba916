//! Renderers: `insta` snapshots of every renderer on the fixture reports (dumpdiff table,
//! markdown and JSON; logscan table, markdown and JSON; postmortem markdown, HTML and
//! summary JSON; losscheck table, markdown and JSON of a tree and of `--inputs`; the
//! dump-tree inspector), and one test per presentation rule of issue 17: output fits
//! `COLUMNS`, one count line, coverage in words that match what is missing, offending files
//! and the next command, numbers that show their difference, plots with distinct ticks and
//! findings that never cover the data.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use rlforensics::compare::tolerance::Verdict;
use rlforensics::dumpdiff::report::{Cell, Coverage, Report, Section, SideSummary};
use rlforensics::dumpdiff::{run, Options};
use rlforensics::logscan::{scan, ScanOptions};
use rlforensics::model::finding::Severity;
use rlforensics::producers::layout::{DumpTree, Producer};
use rlforensics::render::dumpdiff::{
    coverage_lines, json::JsonRenderer, markdown::MarkdownRenderer, summary_line,
    table::TableRenderer,
};
use rlforensics::render::plot::{self, nice_step, tick_text, ticks_in, Panel, Series, YScale};
use rlforensics::render::Renderer;

/// The fixture comparison with four injected faults, as the CLI runs it (adjudicated with
/// losscheck's nexrl-is preset); paths relative to the crate root so snapshots are
/// portable.
fn faulty() -> Report {
    run(&Options {
        self_hosted: PathBuf::from("fixtures/dumps/self_hosted_pt"),
        weaver: Some(PathBuf::from("fixtures/dumps/weaver_faulty_pt")),
        step: 0,
        adjudicate_with: Some("nexrl-is".into()),
        ..Default::default()
    })
    .unwrap()
}

fn table(width: Option<usize>) -> TableRenderer {
    TableRenderer {
        color: false,
        width,
    }
}

fn widest(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

/// A synthetic report of `ranks` ranks × 2 micros over three sections; `fail` lists the
/// (rank, micro) cells that fail in the loss section.
fn synthetic(ranks: u32, fail: &[(u32, u32)], missing: &[(&str, u32, Option<u32>)]) -> Report {
    let cells = |name: &str| -> Vec<Cell> {
        (0..ranks)
            .flat_map(|r| (0..2).map(move |m| (r, m)))
            .map(|(r, m)| {
                let missing_here = missing
                    .iter()
                    .any(|(k, mr, mm)| *k == name && *mr == r && mm.is_none_or(|x| x == m));
                let failing = name == "loss" && fail.contains(&(r, m));
                let verdict = if missing_here {
                    Verdict::Missing
                } else if failing {
                    Verdict::Fail
                } else {
                    Verdict::Pass
                };
                Cell {
                    rank: Some(r),
                    micro: Some(m),
                    verdict,
                    reason: if failing {
                        "loss.loss: 1/1 beyond atol 1e-5 rtol 1.3e-6".into()
                    } else {
                        "3 compared, all within tolerance".into()
                    },
                    rows: None,
                    comparisons: vec![],
                }
            })
            .collect()
    };
    let section = |id: u8, name: &str| {
        let cells = cells(name);
        Section {
            id,
            name: name.into(),
            pair: "self-hosted vs weaver".into(),
            verdict: cells
                .iter()
                .map(|c| c.verdict)
                .max()
                .unwrap_or(Verdict::Skipped),
            cells,
            notes: vec![],
        }
    };
    let sections = vec![
        section(2, "forward_data"),
        section(3, "loss"),
        section(4, "is_loss"),
    ];
    let coverage: Vec<Coverage> = missing
        .iter()
        .map(|(k, r, m)| Coverage {
            kind: (*k).into(),
            rank: Some(*r),
            micro: *m,
            present_on: "self-hosted".into(),
            missing_on: "weaver".into(),
        })
        .collect();
    let verdict = sections
        .iter()
        .map(|s| s.verdict)
        .max()
        .unwrap_or(Verdict::Skipped);
    Report {
        schema_version: 1,
        step: 0,
        sides: vec![
            SideSummary {
                role: "self-hosted".into(),
                root: "runs/a".into(),
                producer: Producer::SelfHosted,
                files: ranks as usize * 4,
                not_placed: vec![],
            },
            SideSummary {
                role: "weaver".into(),
                root: "runs/b".into(),
                producer: Producer::Weaver,
                files: ranks as usize * 6,
                not_placed: vec![],
            },
        ],
        tolerance_file: None,
        verdict,
        coefficients: vec![],
        conventions: vec![],
        diagnosis: vec![],
        sections,
        coverage,
        first_divergence: None,
        worst: vec![],
        adjudication: vec![],
        offending_files: vec![],
        unreadable: Vec::new(),
        files_read: ranks as usize * 10,
        bytes_read: 0,
    }
}

// ---- snapshots of every renderer on fixture reports ----

#[test]
fn snapshot_dumpdiff_table_at_80_columns() {
    insta::assert_snapshot!(table(Some(80)).render(&faulty()).unwrap());
}

#[test]
fn snapshot_dumpdiff_table_unbounded() {
    insta::assert_snapshot!(table(None).render(&faulty()).unwrap());
}

#[test]
fn snapshot_dumpdiff_markdown() {
    insta::assert_snapshot!(MarkdownRenderer.render(&faulty()).unwrap());
}

#[test]
fn snapshot_dumpdiff_json_of_a_synthetic_report() {
    // The fixture report's JSON holds every metric of every tensor (hundreds of KB); the
    // synthetic one has the same layout in a page.
    let r = synthetic(3, &[(1, 0)], &[("loss", 2, Some(1))]);
    insta::assert_snapshot!(JsonRenderer.render(&r).unwrap());
}

#[test]
fn dumpdiff_json_of_the_fixture_names_the_offending_files() {
    let text = JsonRenderer.render(&faulty()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let files: BTreeSet<String> = v["offending_files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["section"] == "is_loss" && f["rank"] == 5 && f["micro"] == 0)
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    let want: BTreeSet<String> = [
        "fixtures/dumps/self_hosted_pt/forward_data/step_000000_rank5_micro0.pt",
        "fixtures/dumps/weaver_faulty_pt/forward_data/step_000000_rank5_micro0.pt",
        "fixtures/dumps/weaver_faulty_pt/is_loss_debug/step_000000_rank5_micro0.pt",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(files, want);
}

fn logscan_report() -> rlforensics::logscan::ScanReport {
    scan(
        &[PathBuf::from("fixtures/logs/debug_faults")],
        &ScanOptions::default(),
    )
    .unwrap()
}

#[test]
fn snapshot_logscan_table_at_80_columns() {
    let r = rlforensics::render::logscan::table::TableRenderer {
        color: false,
        width: Some(80),
    };
    let text = r.render(&logscan_report()).unwrap();
    assert!(widest(&text) <= 80, "{text}");
    insta::assert_snapshot!(text);
}

#[test]
fn snapshot_logscan_table_wide() {
    let r = rlforensics::render::logscan::table::TableRenderer {
        color: false,
        width: None,
    };
    insta::assert_snapshot!(r.render(&logscan_report()).unwrap());
}

#[test]
fn snapshot_logscan_markdown() {
    let text = rlforensics::render::logscan::markdown::MarkdownRenderer
        .render(&logscan_report())
        .unwrap();
    insta::assert_snapshot!(text);
}

#[test]
fn logscan_json_has_the_findings_the_table_counts() {
    let report = logscan_report();
    let text = rlforensics::render::logscan::json::JsonRenderer
        .render(&report)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let n = v["findings"].as_array().unwrap().len();
    assert_eq!(n, report.findings.len());
    let line = rlforensics::render::logscan::table::count_line(&report);
    assert!(line.starts_with(&format!("{n} findings: ")), "{line}");
}

fn postmortem() -> rlforensics::postmortem::Postmortem {
    rlforensics::postmortem::analyze(
        Path::new("fixtures/runs/20251009-091500"),
        &rlforensics::postmortem::Options::default(),
    )
    .unwrap()
}

#[test]
fn snapshot_postmortem_markdown() {
    let md = rlforensics::render::postmortem::markdown::MarkdownRenderer
        .render(&postmortem())
        .unwrap();
    insta::assert_snapshot!(md);
}

#[test]
fn snapshot_postmortem_html_without_images() {
    let html = rlforensics::render::postmortem::html::HtmlRenderer { pngs: &[] }
        .render(&postmortem())
        .unwrap();
    insta::assert_snapshot!(html);
}

/// losscheck's report on the faulty weaver tree (nexrl-is), as the CLI builds it.
fn losscheck_tree_report() -> rlforensics::losscheck::report::Report {
    let tree = DumpTree::discover(Path::new("fixtures/dumps/weaver_faulty_pt")).unwrap();
    let cfg = rlforensics::kernels::presets::preset("nexrl-is").unwrap();
    let tol = rlforensics::losscheck::Tolerance::default();
    let verdicts = rlforensics::losscheck::check_tree(&tree, 0, None, None, &cfg, &tol).unwrap();
    rlforensics::losscheck::report::Report::Tree(rlforensics::losscheck::report::TreeReport::new(
        &cfg, verdicts,
    ))
}

/// losscheck's report on free-standing inputs (trl-grpo), as `--inputs` builds it.
fn losscheck_inputs_report() -> rlforensics::losscheck::report::Report {
    let file = Path::new("fixtures/kernels/trl_grpo_normal.safetensors");
    let cfg = rlforensics::kernels::presets::preset("trl-grpo").unwrap();
    let value = rlforensics::formats::read_any(file).unwrap();
    let inputs = rlforensics::losscheck::inputs_from_value(&value, file, &cfg).unwrap();
    rlforensics::losscheck::report::Report::Inputs(
        rlforensics::losscheck::report::InputsReport::compute(&inputs, &cfg, file).unwrap(),
    )
}

/// Every losscheck renderer (table, markdown, JSON) on both report kinds.
#[test]
fn snapshot_losscheck_every_format() {
    use rlforensics::render::{by_name, Format, Style};
    type Lc = rlforensics::losscheck::report::Report;
    for (kind, report) in [
        ("tree", losscheck_tree_report()),
        ("inputs", losscheck_inputs_report()),
    ] {
        for format in [Format::Table, Format::Markdown, Format::Json] {
            let text = by_name::<Lc>(format, Style::default())
                .render(&report)
                .unwrap();
            insta::assert_snapshot!(format!("losscheck_{kind}_{}", format.name()), text);
        }
    }
}

/// The table format of a tree: the count line, one table row per cell, and below it what
/// each cell that is not consistent says in its `Verdict::line` (after its file name).
#[test]
fn losscheck_table_is_a_count_line_a_row_per_cell_and_the_faults() {
    let report = losscheck_tree_report();
    let rlforensics::losscheck::report::Report::Tree(t) = &report else {
        panic!("a tree report");
    };
    let got = rlforensics::render::losscheck::table::TableRenderer {
        color: false,
        width: None,
    }
    .render(&report)
    .unwrap();
    assert_eq!(
        got.lines().next().unwrap(),
        rlforensics::render::losscheck::table::count_line(t)
    );
    let rows = got.lines().filter(|l| l.contains(" ┆ ")).count();
    assert_eq!(rows, t.verdicts.len() + 1, "a header and a row per cell");
    for v in &t.verdicts {
        let line = v.line();
        let head = format!("rank {} micro {} {}: ", v.rank, v.micro, v.file.display());
        let what = line.strip_prefix(&head).unwrap();
        let shown = got.lines().any(|l| l.ends_with(what));
        assert_eq!(
            shown,
            v.status != rlforensics::losscheck::Status::Consistent,
            "{line}"
        );
    }
}

#[test]
fn snapshot_logscan_json() {
    let text = rlforensics::render::logscan::json::JsonRenderer
        .render(&logscan_report())
        .unwrap();
    insta::assert_snapshot!(text);
}

#[test]
fn snapshot_postmortem_summary_json() {
    let text = rlforensics::render::postmortem::json::JsonRenderer
        .render(&postmortem())
        .unwrap();
    insta::assert_snapshot!(text);
}

#[test]
fn snapshot_inspect_layout_with_a_hole() {
    let tree = DumpTree::discover(Path::new("fixtures/dumps/weaver_faulty_pt")).unwrap();
    insta::assert_snapshot!(rlforensics::inspect::render_layout(&tree));
}

// ---- output fits the terminal ----

#[test]
fn sixty_four_ranks_fit_80_columns_as_rank_ranges() {
    let r = synthetic(64, &[(17, 1), (40, 0)], &[]);
    let text = table(Some(80)).render(&r).unwrap();
    assert!(widest(&text) <= 80, "{text}");
    // Ranks with identical columns share one: 0-16, 17, 18-39, 40, 41-63.
    let header = text.lines().find(|l| l.contains("section")).unwrap();
    for h in ["r0-16", "r17", "r18-39", "r40", "r41-63"] {
        assert!(header.contains(h), "{header}");
    }
    assert!(text.starts_with("dumpdiff step 0: FAIL — 2 cells fail in 2 ranks\n"));
    // The full table is 64 columns wide: more than 300 characters.
    assert!(widest(&table(None).render(&r).unwrap()) > 300);
}

#[test]
fn colour_does_not_shrink_the_grid() {
    // The fixture's full grid is exactly 80 columns; escape codes must not count.
    let coloured = TableRenderer {
        color: true,
        width: Some(80),
    }
    .render(&faulty())
    .unwrap();
    assert!(coloured.contains("r10"), "{coloured}");
    assert!(!coloured.contains("share a column"), "{coloured}");
    assert!(coloured.contains("\x1b["));
}

#[test]
fn sixty_four_ranks_that_all_differ_become_a_strip() {
    // Every other rank fails: no two neighbours share a column.
    let fail: Vec<(u32, u32)> = (0..64).filter(|r| r % 2 == 1).map(|r| (r, 0)).collect();
    let r = synthetic(64, &fail, &[]);
    let text = table(Some(80)).render(&r).unwrap();
    assert!(widest(&text) <= 80, "{text}");
    assert!(text.contains("ranks 0-63, one column per rank (worst micro of each):"));
    assert!(text.contains("\n(✓ pass  ! warn  ✗ fail  – one side only  · not compared)\n"));
    assert!(!text.contains("one symbol per micro"));
    let loss = text.lines().find(|l| l.starts_with("3 loss")).unwrap();
    let strip: String = loss.chars().skip_while(|c| *c != '✓').collect();
    let want: String = (0..64)
        .map(|r| if r % 2 == 1 { '✗' } else { '✓' })
        .collect();
    assert_eq!(strip, want);
    assert!(text.starts_with("dumpdiff step 0: FAIL — 32 cells fail in 32 ranks\n"));
}

#[test]
fn a_strip_too_wide_for_the_terminal_groups_ranks() {
    let fail: Vec<(u32, u32)> = (0..512).filter(|r| r % 2 == 1).map(|r| (r, 0)).collect();
    let r = synthetic(512, &fail, &[]);
    let text = table(Some(80)).render(&r).unwrap();
    assert!(widest(&text) <= 80, "{text}");
    assert!(
        text.contains("ranks 0-511, one column per 8 ranks"),
        "{text}"
    );
}

#[test]
fn markdown_keeps_one_column_per_rank() {
    let r = synthetic(64, &[(17, 1)], &[]);
    let md = MarkdownRenderer.render(&r).unwrap();
    let header = md
        .lines()
        .find(|l| l.starts_with("| section | r0 |"))
        .unwrap();
    assert_eq!(header.matches(" | r").count(), 64);
    assert!(header.ends_with("| r63 |"));
}

/// stdout of the README's dumpdiff command on the faulty fixture (exit 1) at `columns`.
fn faulty_fixture_table(columns: &str) -> String {
    let out = Command::cargo_bin("dumpdiff")
        .unwrap()
        .env("COLUMNS", columns)
        .args([
            "--self-hosted-dir",
            "fixtures/dumps/self_hosted_pt",
            "--weaver-dir",
            "fixtures/dumps/weaver_faulty_pt",
            "--step",
            "0",
        ])
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    String::from_utf8(out).unwrap()
}

#[test]
fn cli_table_fits_columns_80_on_the_fixtures() {
    let text = faulty_fixture_table("80");
    assert!(widest(&text) <= 80, "{text}");
    let text = faulty_fixture_table("50");
    assert!(text.contains("ranks 0-11, one column per rank"), "{text}");
}

#[test]
fn cli_logscan_fits_columns_80() {
    let out = Command::cargo_bin("logscan")
        .unwrap()
        .env("COLUMNS", "80")
        .arg("fixtures/logs/debug_faults")
        .assert()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert!(widest(&text) <= 80, "{text}");
    assert!(text.contains("evidence: "), "{text}");
}

// ---- count summary, coverage words, files, next command ----

#[test]
fn the_count_line_counts_cells_ranks_and_files() {
    let r = synthetic(4, &[(1, 0), (1, 1), (3, 0)], &[("loss", 2, Some(1))]);
    assert_eq!(
        summary_line(&r),
        "3 cells fail in 2 ranks; 1 file on one side only"
    );
    assert_eq!(summary_line(&synthetic(4, &[], &[])), "all 8 cells pass");
    let f = faulty();
    assert_eq!(
        summary_line(&f),
        "2 cells fail in 2 ranks; 6 files on one side only"
    );
}

#[test]
fn one_missing_file_is_not_called_a_missing_rank() {
    let r = synthetic(12, &[], &[("loss", 11, Some(1))]);
    assert_eq!(
        coverage_lines(&r),
        ["rank 11 missing on weaver: loss micro 1 — present on self-hosted (1 file)"]
    );
    let text = table(Some(100)).render(&r).unwrap();
    assert!(text.contains(
        "one side only (1 file):\n  rank 11 missing on weaver: loss micro 1 — present on self-hosted (1 file)\n"
    ));
    let both = synthetic(
        12,
        &[],
        &[
            ("forward_data", 10, Some(0)),
            ("forward_data", 10, Some(1)),
            ("loss", 10, Some(0)),
            ("loss", 10, Some(1)),
        ],
    );
    assert_eq!(
        coverage_lines(&both),
        ["rank 10 missing on weaver: forward_data, loss micros 0-1 — present on self-hosted (4 files)"]
    );
}

#[test]
fn markdown_never_prints_rust_options() {
    let md = MarkdownRenderer.render(&faulty()).unwrap();
    assert!(!md.contains("Some("), "{md}");
    assert!(!md.contains("None"), "{md}");
    // Six real files (forward_data and loss × 2 micros, param, gradient), not the 8 gaps
    // (the importance-sampling section counts forward_data again against is_loss_debug).
    assert!(md.contains(
        "- rank 10 missing on weaver: forward_data, is_loss_debug, loss micros 0-1; gradient, param — present on self-hosted (6 files)\n"
    ), "{md}");
}

#[test]
fn the_table_names_files_diagnosis_and_next_command() {
    let text = table(Some(100)).render(&faulty()).unwrap();
    assert!(text.contains(
        "  rank 5 micro 0:\n    self-hosted  fixtures/dumps/self_hosted_pt/forward_data/step_000000_rank5_micro0.pt\n    self-hosted  fixtures/dumps/self_hosted_pt/loss/step_000000_rank5_micro0.pt\n    weaver       fixtures/dumps/weaver_faulty_pt/forward_data/step_000000_rank5_micro0.pt\n"
    ));
    // At 80 columns the paths are relative to each side's root and the command is cut
    // with shell continuations.
    let narrow = table(Some(80)).render(&faulty()).unwrap();
    assert!(narrow.contains("    weaver       …/is_loss_debug/step_000000_rank5_micro0.pt\n"));
    assert!(narrow.contains(
        "next:\n  losscheck --dump-dir fixtures/dumps/weaver_faulty_pt --step 0 --rank 3 \\\n      --micro 1 --preset nexrl-is\n"
    ), "{narrow}");
    assert!(text.contains(
        "next:\n  losscheck --dump-dir fixtures/dumps/weaver_faulty_pt --step 0 --rank 3 --micro 1 --preset nexrl-is\n  losscheck --dump-dir fixtures/dumps/weaver_faulty_pt --step 0 --rank 5 --micro 0 --preset nexrl-is\n"
    ));
    // The diagnosis that was only in the JSON (whitespace-normalised: the line wraps).
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains(
        "weaver: dumped loss 13.06 ≠ recomputed 0.5677 — every intermediate matches: the aggregation differs; the dumped loss equals the recomputed token-mean × 23 valid tokens: a sum, not a mean"
    ), "{text}");
    let md = MarkdownRenderer.render(&faulty()).unwrap();
    assert!(md.contains("a sum, not a mean"));
    assert!(md.contains("```sh\nlosscheck --dump-dir fixtures/dumps/weaver_faulty_pt --step 0 --rank 3 --micro 1 --preset nexrl-is\n"));
}

// ---- numbers ----

#[test]
fn numbers_side_by_side_never_look_equal() {
    use rlforensics::fmt::{column, num, pair};
    let (a, b) = pair(-0.20841, -0.20844);
    assert_ne!(a, b);
    assert_eq!((a.as_str(), b.as_str()), ("-0.20841", "-0.20844"));
    assert_eq!(num(1.5509905147383042e-2), "0.01551");
    assert_eq!(column(&[-0.0031, 6.973e-4]), ["-3.1e-3", "6.973e-4"]);
    // No raw float in the fixture outputs.
    let raw = regex_like_raw_float;
    for text in [
        table(None).render(&faulty()).unwrap(),
        MarkdownRenderer.render(&faulty()).unwrap(),
        rlforensics::render::postmortem::markdown::MarkdownRenderer
            .render(&postmortem())
            .unwrap(),
    ] {
        assert!(raw(&text).is_none(), "{:?}", raw(&text));
    }
}

/// The first number with 7 or more digits after the point (`1.5509905147383042e-2`).
fn regex_like_raw_float(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'.' && i > 0 && b[i - 1].is_ascii_digit() {
            let n = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            if n >= 7 {
                return Some(text[i.saturating_sub(3)..(i + 1 + n).min(text.len())].to_string());
            }
        }
        i += 1;
    }
    None
}

#[test]
fn losscheck_prints_equal_looking_numbers_with_more_digits() {
    use rlforensics::losscheck::{Layout, Status, Verdict as LcVerdict};
    let v = LcVerdict {
        file: "x.pt".into(),
        layout: Layout::SelfHosted,
        step: 0,
        rank: 1,
        micro: 0,
        status: Status::Inconsistent,
        dumped_loss: -0.208412,
        recomputed_loss: -0.208438,
        first_divergence: None,
        checks: vec![],
        tokens: 23,
        notes: vec![],
        differs: vec![],
        loss_ok: false,
        own_sum: false,
        own_shift: false,
    };
    assert_eq!(
        v.line(),
        "rank 1 micro 0 x.pt: dumped loss -0.20841 ≠ recomputed -0.20844"
    );
}

/// Two numbers that print alike are never called different (issue 28): the first held-out
/// NexRL step's "dumped loss 0.0430426 ≠ recomputed 0.043042596" when what differed was
/// another scalar.
#[test]
fn losscheck_never_calls_a_loss_recomputed_alike_different() {
    use rlforensics::losscheck::{Layout, ScalarCheck, Status, Verdict as LcVerdict};
    let v = LcVerdict {
        file: "x.pt".into(),
        layout: Layout::SelfHosted,
        step: 0,
        rank: 0,
        micro: 1,
        status: Status::Inconsistent,
        dumped_loss: 0.0430426,
        recomputed_loss: 0.043042596,
        first_divergence: None,
        checks: vec![ScalarCheck {
            name: "entropy_loss".into(),
            dumped: 1.25,
            recomputed: 1.5,
            ok: false,
        }],
        tokens: 23,
        notes: vec![],
        differs: vec![],
        loss_ok: true,
        own_sum: false,
        own_shift: false,
    };
    assert_eq!(
        v.line(),
        "rank 0 micro 1 x.pt: inconsistent, though its loss 0.04304 is recomputed alike; entropy_loss 1.25 ≠ recomputed 1.5"
    );
    assert!(rlforensics::fmt::alike(0.0430426, 0.043042596));
}

// ---- postmortem replay ----

#[test]
fn replay_uses_the_commands_seed_and_a_clean_learning_rate() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("20251009-130000");
    copy_dir(Path::new("fixtures/runs/20251009-130000"), &run_dir);
    let meta_path = run_dir.join("run_metadata.json");
    let mut meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta_path).unwrap()).unwrap();
    let argv = meta["argv"].as_array_mut().unwrap();
    let i = argv.iter().position(|a| a == "--learning-rate").unwrap();
    argv[i + 1] = "1e-05".into();
    argv.push("--seed".into());
    argv.push("7".into());
    meta["config"]["learning_rate"] = serde_json::json!(1e-5);
    std::fs::write(&meta_path, serde_json::to_string(&meta).unwrap()).unwrap();
    let pm =
        rlforensics::postmortem::analyze(&run_dir, &rlforensics::postmortem::Options::default())
            .unwrap();
    let replay = pm.replay.as_ref().unwrap();
    assert!(replay.command.contains("--seed 7"), "{}", replay.command);
    assert!(
        replay.notes[0].starts_with("Runs the same arguments with seed 7 "),
        "{}",
        replay.notes[0]
    );
    let fix = replay.fix_command.as_ref().unwrap();
    assert!(fix.contains("--learning-rate 1e-6"), "{fix}");
    assert!(!fix.contains("0000000"), "{fix}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

// ---- inspect ----

#[test]
fn inspect_names_a_rank_missing_from_the_tree() {
    let out = Command::cargo_bin("dumpdiff")
        .unwrap()
        .args(["--inspect", "fixtures/dumps/weaver_faulty_pt"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    let loss = text.lines().find(|l| l.contains(" loss ")).unwrap();
    assert!(loss.contains("0-9,11") && loss.contains("rank10"), "{text}");
    assert!(!loss.contains("—"), "{loss}");
}

// ---- plots ----

#[test]
fn tick_labels_are_distinct_nice_numbers() {
    for (lo, hi) in [
        (0.0, 2.4),
        (0.0151, 0.0249),
        (5.039, 5.097),
        (-0.05, 0.03),
        (1e-7, 9e-7),
    ] {
        let step = nice_step(hi - lo, 5);
        let m = step / 10f64.powf(step.log10().floor());
        assert!(
            [1.0, 2.0, 5.0].iter().any(|n| (m - n).abs() < 1e-9),
            "{step}"
        );
        let ticks = ticks_in((lo / step).floor() * step, (hi / step).ceil() * step, step);
        let labels: Vec<String> = ticks.iter().map(|t| tick_text(*t, step)).collect();
        let distinct: BTreeSet<&String> = labels.iter().collect();
        assert_eq!(distinct.len(), labels.len(), "{labels:?}");
        assert!(labels.len() >= 3, "{labels:?}");
    }
    assert_eq!(nice_step(2.4, 5), 0.5);
    let labels: Vec<String> = ticks_in(0.0, 2.5, 0.5)
        .iter()
        .map(|t| tick_text(*t, 0.5))
        .collect();
    assert_eq!(labels, ["0", "0.5", "1.0", "1.5", "2.0", "2.5"]);
}

#[test]
fn a_small_negative_next_to_a_spike_gets_a_symlog_axis() {
    let kl = [0.002, 0.002, -0.003, -0.003, 5.0, 0.004];
    let s = YScale::choose(&kl);
    assert_eq!(s, YScale::SymLog(0.0015));
    // The negative values stay a visible share of the axis: 0.003 maps to a third of a
    // decade below zero against 3.5 decades above.
    assert!((s.fwd(-0.003) + 3f64.log10()).abs() < 1e-12);
    assert!((s.inv(s.fwd(5.0)) - 5.0).abs() < 1e-9);
    // Both signs of one size: linear, with a zero line.
    assert_eq!(YScale::choose(&[-0.05, 0.03]), YScale::Linear);
    assert_eq!(YScale::choose(&[0.1, 0.3]), YScale::Linear);
}

#[test]
fn plots_render_with_the_most_severe_finding_marked() {
    let report = logscan_report();
    let panels = plot::panels(&report.frame, &report.findings);
    let marked: Vec<&Panel> = panels.iter().filter(|p| p.most_severe.is_some()).collect();
    assert!(!marked.is_empty());
    // The worst severity among the findings the panels show.
    let worst = panels
        .iter()
        .flat_map(|p| p.marks.iter().map(|m| m.2))
        .max()
        .unwrap_or(Severity::Info);
    for p in &marked {
        assert_eq!(p.marks[p.most_severe.unwrap()].2, worst);
    }
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("grid.png");
    plot::write_grid(&png, &panels, Some(3)).unwrap();
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    // Width and height from the IHDR chunk: two columns of PANEL_SIZE.
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    assert_eq!(w, plot::PANEL_SIZE.0 * 2);
    let one = Panel {
        key: "kl",
        title: "KL".into(),
        series: vec![Series {
            label: "kl".into(),
            points: vec![(1, 0.002), (2, -0.003), (3, 5.0), (4, f64::NAN)],
        }],
        band: vec![],
        marks: vec![(2, 2, Severity::Error, "kl-negative".into())],
        most_severe: Some(0),
    };
    let svg = dir.path().join("kl.svg");
    plot::write_panel(&svg, &one, None).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("KL (symlog)"));
    assert!(text.contains("kl-negative (error — most severe finding)"));
    assert!(text.contains("kl non-finite"));
}

/// The postmortem document is built once: every section heading it holds is in both the
/// markdown and the HTML report, in the same order, and the blocks shown by one format only
/// are the few listed in `postmortem::document`.
#[test]
fn postmortem_document_sections_are_the_same_in_both_formats() {
    use rlforensics::postmortem::document::{Block, Document, Inline};
    let pm = postmortem();
    let doc = Document::of(&pm);
    let md = rlforensics::render::postmortem::markdown::MarkdownRenderer
        .render(&pm)
        .unwrap();
    let html = rlforensics::render::postmortem::html::HtmlRenderer { pngs: &[] }
        .render(&pm)
        .unwrap();
    let headings: Vec<String> = doc
        .blocks
        .iter()
        .filter_map(|b| match b {
            Block::Heading { level: 2, text, .. } => match text.as_slice() {
                [Inline::Text(t)] => Some(t.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(
        headings,
        [
            "What to do",
            "Crash",
            "Offending batch",
            "Last steps before the crash",
            "Findings over the whole run",
            "Pre-flight",
            "Replay",
            "Plots",
            "Data notes",
        ]
    );
    let (mut at_md, mut at_html) = (0, 0);
    for h in &headings {
        let m = md[at_md..]
            .find(&format!("\n## {h}\n"))
            .unwrap_or_else(|| panic!("{h} not in report.md after byte {at_md}"));
        at_md += m + 1;
        let x = html[at_html..]
            .find(&format!(">{h}</h2>"))
            .unwrap_or_else(|| panic!("{h} not in report.html after byte {at_html}"));
        at_html += x + 1;
    }
    let only = doc
        .blocks
        .iter()
        .filter(|b| matches!(b, Block::Only { .. }))
        .count();
    // Crash summary ×2, the trainer's last frame (markdown), offending batch ×2, findings
    // table ×2.
    assert_eq!(only, 7);
    let json = serde_json::to_value(&doc).unwrap();
    assert_eq!(json["title"], "20251009-091500");
    assert_eq!(json["blocks"][0]["block"], "heading");
}
