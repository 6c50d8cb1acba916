//! Tests of the `.wandb` reader (`wandb.rs`).

use super::*;
use crate::logs::trackers::wandb_record::fast_history;

fn item(key: &str, json: &str) -> HistoryItem {
    HistoryItem {
        key: String::new(),
        nested_key: vec![key.to_string()],
        boolean: None,
        integer: None,
        number: None,
        value_json: json.to_string(),
    }
}

#[test]
fn history_values_bare_nan_strings_media_and_the_trainer_step() {
    let h = HistoryRecord {
        item: vec![
            item("_step", "7"),
            item("_timestamp", "1700000000.5"),
            item("train/global_step", "70"),
            item("a", "NaN"),
            item("b", "-Infinity"),
            item("c", "\"NaN\""),
            item("d", "true"),
            item(
                "e",
                "{\"x\": 1.5, \"img\": {\"_type\": \"image-file\", \"w\": 3}}",
            ),
            HistoryItem {
                number: Some(2.5),
                value_json: String::new(),
                ..item("f", "")
            },
        ],
        step: Some(HistoryStep { num: 7 }),
    };
    // The allocation-free walk reads the same row from the encoded record.
    let bytes = Record {
        history: Some(h.clone()),
        config: None,
        run: None,
    }
    .encode_to_vec();
    // Both paths, each with its own keys, as the records a reader hands on.
    let rows = |fast: bool| {
        let mut batches = Vec::new();
        let mut sink = |b| {
            batches.push(b);
            None
        };
        let mut w = RowWriter::new(&mut sink);
        let mut row = Row::default();
        if fast {
            assert_eq!(fast_history(&bytes, &mut w.keys, &mut row), Some(true));
        } else {
            history_row(&h, &mut w.keys, &mut row);
        }
        row.finish(&mut w, 1, &mut FileStats::default());
        w.flush();
        drop(w);
        let mut out = Vec::new();
        let mut names = Vec::new();
        for b in &batches {
            super::super::rows::to_records(b, &mut names, 0, &mut |r| out.push(r.clone()));
        }
        out
    };
    let (fast, slow) = (rows(true), rows(false));
    // (Debug text: the row holds a NaN, which `==` never equals.)
    assert_eq!(format!("{fast:?}"), format!("{slow:?}"));
    assert_eq!(slow.len(), 1);
    let r = &slow[0];
    assert_eq!(r.step, Some(70), "train/global_step wins over _step");
    assert_eq!(r.timestamp, Some(1_700_000_000.5));
    let keys: Vec<&str> = r.fields.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["train/global_step", "a", "b", "d", "e.x", "f"]);
    assert!(r.fields[1].1.is_nan());
    assert_eq!(r.fields[2].1, f64::NEG_INFINITY);
    assert_eq!(r.fields[3].1, 1.0);
    assert_eq!(r.fields[4].1, 1.5);
    assert_eq!(r.fields[5].1, 2.5);
}

/// A `.wandb` file of `records`, framed as wandb's LevelDB-style writer frames them
/// (wandb/wandb `wandb/sdk/internal/datastore.py`: 32 KiB blocks, 7-byte headers of
/// CRC-32 over type and data, length, type; FULL 1, FIRST 2, MIDDLE 3, LAST 4; a block
/// tail shorter than a header zero-filled). Returns the file and each record's offset.
fn wandb_file(records: &[Vec<u8>]) -> (Vec<u8>, Vec<usize>) {
    let mut out = b":W&B".to_vec();
    out.extend_from_slice(&[0xE1, 0xBE, 0]);
    let mut at = Vec::new();
    let frame = |out: &mut Vec<u8>, typ: u8, data: &[u8]| {
        let mut h = crc32fast::Hasher::new();
        h.update(&[typ]);
        h.update(data);
        out.extend_from_slice(&h.finalize().to_le_bytes());
        out.extend_from_slice(&(data.len() as u16).to_le_bytes());
        out.push(typ);
        out.extend_from_slice(data);
    };
    for r in records {
        let mut left = BLOCK - out.len() % BLOCK;
        if left < REC_HEADER {
            out.resize(out.len() + left, 0);
            left = BLOCK;
        }
        at.push(out.len());
        if r.len() + REC_HEADER <= left {
            frame(&mut out, 1, r);
            continue;
        }
        let mut rest = &r[..];
        let mut typ = 2;
        while !rest.is_empty() {
            let left = BLOCK - out.len() % BLOCK;
            let n = rest.len().min(left - REC_HEADER);
            let t = if n == rest.len() { 4 } else { typ };
            frame(&mut out, t, &rest[..n]);
            rest = &rest[n..];
            typ = 3;
        }
    }
    (out, at)
}

/// A run's records: a run record with its config, then `n` history rows (every 500th
/// a large one, fragmented over blocks), config updates and a removal among them.
fn run_records(n: usize) -> Vec<Vec<u8>> {
    let cfg = |pairs: &[(&str, &str)], remove: &[&str]| ConfigRecord {
        update: pairs
            .iter()
            .map(|(k, v)| ConfigItem {
                key: k.to_string(),
                nested_key: Vec::new(),
                value_json: v.to_string(),
            })
            .collect(),
        remove: remove
            .iter()
            .map(|k| ConfigItem {
                key: k.to_string(),
                nested_key: Vec::new(),
                value_json: String::new(),
            })
            .collect(),
    };
    let mut out = vec![Record {
        history: None,
        config: None,
        run: Some(RunRecord {
            config: Some(cfg(&[("lr", "0.001"), ("epsilon", "0.2")], &[])),
        }),
    }
    .encode_to_vec()];
    for i in 0..n {
        let mut items = vec![
            item("_step", &i.to_string()),
            item("loss", &format!("{}", 1.0 / (i as f64 + 1.0))),
        ];
        if i % 500 == 7 {
            items.push(item("big", &format!("\"{}\"", "x".repeat(450_000))));
        }
        let rec = Record {
            history: Some(HistoryRecord {
                item: items,
                step: Some(HistoryStep { num: i as i64 }),
            }),
            config: (i % 1000 == 999).then(|| cfg(&[("epsilon", &format!("{i}"))], &["lr"])),
            run: None,
        };
        out.push(rec.encode_to_vec());
    }
    out
}

type Got = (
    std::result::Result<(), String>,
    Vec<String>,
    BTreeMap<String, String>,
);

/// `bytes` read for its rows keeping its config records (the scan's one pass), with the
/// kept records applied to a config.
fn rows_and_config(bytes: &[u8]) -> Got {
    let mut batches = Vec::new();
    let mut sink = |b| {
        batches.push(b);
        None
    };
    let mut keep = Vec::new();
    let mut stats = FileStats::default();
    let res = {
        let mut w = RowWriter::new(&mut sink);
        let r = read_with_configs(Path::new("run.wandb"), bytes, &mut stats, &mut w, &mut keep);
        w.flush();
        r
    };
    let (mut names, mut rows) = (Vec::new(), Vec::new());
    for b in &batches {
        super::super::rows::to_records(b, &mut names, 0, &mut |r| rows.push(format!("{r:?}")));
    }
    let mut cfg = BTreeMap::new();
    super::super::wandb_config::apply_configs(&keep, &mut cfg);
    (res.map_err(|e| e.to_string()), rows, cfg)
}

/// `bytes` read by the config pass ([`read`] with a config).
fn config_pass(bytes: &[u8]) -> (std::result::Result<(), String>, BTreeMap<String, String>) {
    let mut sink = |_| None;
    let mut w = RowWriter::new(&mut sink);
    let mut cfg = BTreeMap::new();
    let r = read(
        Path::new("run.wandb"),
        bytes,
        &mut FileStats::default(),
        &mut w,
        Some(&mut cfg),
    );
    (r.map_err(|e| e.to_string()), cfg)
}

#[test]
fn one_pass_keeps_the_config_the_config_pass_reads() {
    let (file, _) = wandb_file(&run_records(5000));
    assert!(
        file.len() > CHUNK_BLOCKS * BLOCK,
        "more than one read chunk"
    );
    let (res, rows, cfg) = rows_and_config(&file);
    assert_eq!(res, Ok(()));
    assert_eq!(rows.len(), 5000);
    assert!(rows[4999].contains("step: Some(4999)"), "{}", rows[4999]);
    let (res2, want) = config_pass(&file);
    assert_eq!(res2, Ok(()));
    assert_eq!(cfg, want);
    // The run record's epsilon, updated last at record 4999; lr removed.
    assert_eq!(want.get("epsilon").map(String::as_str), Some("4999"));
    assert!(!want.contains_key("lr"));
}

#[test]
fn a_corrupt_record_in_the_middle_is_the_first_error_in_both_passes() {
    let recs = run_records(5000);
    let (file, at) = wandb_file(&recs);
    // A whole record in the second parallel part (records 2049..), its data changed.
    let k = 3000;
    let mut bad = file.clone();
    bad[at[k] + REC_HEADER + 3] ^= 0x10;
    let want = format!(
        "byte {}: W&B record CRC mismatch (type 1, length {})",
        at[k],
        recs[k].len()
    );
    let (res, rows, _) = rows_and_config(&bad);
    assert!(res.as_ref().unwrap_err().contains(&want), "{res:?}");
    // The rows before it were read (record k is row k - 1: the run record has none).
    assert_eq!(rows.len(), k - 1);
    let (res2, _) = config_pass(&bad);
    assert!(res2.unwrap_err().contains(&want));
    // A later record corrupt as well: the earlier one is still the error.
    bad[at[k + 100] + REC_HEADER + 3] ^= 0x10;
    assert!(rows_and_config(&bad).0.unwrap_err().contains(&want));
    // A type byte changed: the CRC (which covers it) fails first, as before.
    let mut typ = file.clone();
    typ[at[k] + 6] = 7;
    let err = rows_and_config(&typ).0.unwrap_err();
    assert!(
        err.contains(&format!("byte {}: W&B record CRC mismatch (type 7", at[k])),
        "{err}"
    );
}

#[test]
fn a_record_cut_by_the_end_keeps_the_rows_before_it() {
    let recs = run_records(300);
    let (file, at) = wandb_file(&recs);
    let cut = &file[..at[300] + REC_HEADER + 5];
    let (res, rows, cfg) = rows_and_config(cut);
    assert_eq!(res, Ok(()));
    assert_eq!(rows.len(), 299);
    assert_eq!(cfg.get("lr").map(String::as_str), Some("0.001"));
}

/// Everything a pass over `bytes` cut by `layout` gives, as text: its result, the rows
/// (record numbers included), the config (kept in a rows pass, applied in a config pass)
/// and the file's statistics.
fn pass_at(bytes: &[u8], layout: Layout, config: bool) -> String {
    let mut batches = Vec::new();
    let mut sink = |b| {
        batches.push(b);
        None
    };
    let mut stats = FileStats::default();
    let (mut keep, mut cfg) = (Vec::new(), BTreeMap::new());
    let res = {
        let mut w = RowWriter::new(&mut sink);
        let mode = if config {
            Mode::Config(&mut cfg)
        } else {
            Mode::Rows(Some(&mut keep))
        };
        let r = read_mode(
            Path::new("run.wandb"),
            bytes,
            &mut stats,
            &mut w,
            mode,
            layout,
        );
        w.flush();
        r.map_err(|e| e.to_string())
    };
    super::super::wandb_config::apply_configs(&keep, &mut cfg);
    let (mut names, mut rows) = (Vec::new(), Vec::new());
    for b in &batches {
        super::super::rows::to_records(b, &mut names, 0, &mut |r| rows.push(format!("{r:?}")));
    }
    format!("{res:?}\n{}\n{cfg:?}\n{stats:?}", rows.join("\n"))
}

/// The layouts tried: parts of 1 to 4 blocks in chunks of 1 to 9 blocks (a record's
/// fragments crossing part and chunk boundaries at every offset), and one part per
/// chunk as large as the test files (the file framed front to back in one piece).
fn layouts() -> Vec<Layout> {
    let mut out = vec![Layout {
        chunk_blocks: 64,
        part_blocks: 64,
    }];
    for chunk_blocks in 1..=9 {
        for part_blocks in 1..=4 {
            out.push(Layout {
                chunk_blocks,
                part_blocks,
            });
        }
    }
    out
}

#[test]
fn parts_of_every_size_give_the_rows_of_one_front_to_back_pass() {
    // 1,200 rows: three large records, each fragmented over 14 blocks (so over several
    // parts and chunks), config updates among them.
    let (file, at) = wandb_file(&run_records(1200));
    assert!(file.len() > 40 * BLOCK && file.len() < 64 * BLOCK);
    // A file cut inside the second large record, and one with a corrupt record after it.
    let cut = &file[..at[1008] + 100_000];
    let mut bad = file.clone();
    bad[at[1100] + REC_HEADER + 3] ^= 0x10;
    // A record that is no `Record` protobuf: field 2 a varint, which prost refuses.
    let mut recs = run_records(900);
    recs[850] = vec![0x10, 0x01];
    let (junk, _) = wandb_file(&recs);
    // The writer's zero tail in the last (short) block.
    let mut zeros = file.clone();
    zeros.resize(file.len() + 100, 0);
    for (name, bytes) in [
        ("whole", &file[..]),
        ("zeros", &zeros[..]),
        ("cut", cut),
        ("bad", &bad[..]),
        ("junk", &junk[..]),
    ] {
        for config in [false, true] {
            let want = pass_at(bytes, layouts()[0], config);
            for layout in layouts() {
                let got = pass_at(bytes, layout, config);
                assert!(
                    got == want,
                    "{name} config={config} chunk {} part {}",
                    layout.chunk_blocks,
                    layout.part_blocks
                );
            }
        }
    }
    // What the one-piece pass reads, exactly.
    let whole = pass_at(&file, layouts()[0], false);
    assert!(whole.starts_with("Ok(())\n"));
    assert_eq!(whole.matches("source: Wandb").count(), 1200);
    assert!(whole.contains("step: Some(1007), timestamp: None, source: Wandb, file: 0, line: 1009"));
    assert!(whole.contains("lines: 1201, records: 1200"));
    // Bytes read stop at the start of the block the zero tail is in.
    let zeros = pass_at(&zeros, layouts()[0], false);
    assert!(zeros.contains("lines: 1201, records: 1200"));
    let block_start = file.len() / BLOCK * BLOCK;
    assert!(
        zeros.contains(&format!("bytes: {block_start}, ")),
        "{zeros}"
    );
    assert!(whole.contains(&format!("bytes: {}, ", file.len())));
    let cut = pass_at(cut, layouts()[0], false);
    assert!(cut.contains("lines: 1008, records: 1007"), "{cut}");
    assert!(cut.contains(&format!("truncated last record at byte {}", at[1008])));
    let bad = pass_at(&bad, layouts()[0], false);
    assert!(bad.contains(&format!(
        "byte {}: W&B record CRC mismatch (type 1",
        at[1100]
    )));
    assert_eq!(bad.matches("source: Wandb").count(), 1099);
    let junk = pass_at(&junk, layouts()[0], false);
    assert!(
        junk.contains("record 851 is not a W&B Record protobuf"),
        "{junk}"
    );
}
