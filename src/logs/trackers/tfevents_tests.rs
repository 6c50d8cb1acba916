//! Tests of the TensorBoard reader (`tfevents.rs`): CRC, tensor scalars, and the
//! parallel decode against a step-by-step reading at every chunk and part split.

use super::*;

#[test]
fn masked_crc_matches_the_python_crc32c_package() {
    // Values from `crc32c.crc32c` with TFRecord's masking, computed in Python.
    assert_eq!(masked_crc(&1234u64.to_le_bytes()), 1_450_249_831);
    assert_eq!(masked_crc(b"hello tensorboard"), 3_631_509_412);
}

/// A row as a step-by-step reader makes it: `(step, record number, fields)`.
type Row = (i64, u64, Vec<(String, f64)>);

/// One TFRecord around `body`, as TensorFlow's writer frames it.
fn record(body: &[u8]) -> Vec<u8> {
    let len = (body.len() as u64).to_le_bytes();
    let mut out = len.to_vec();
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(body);
    out.extend_from_slice(&masked_crc(body).to_le_bytes());
    out
}

/// An event file of `steps` steps: per step a `loss` and a `kl` event (simple values,
/// the fast path) and, every 7th step, a tensor scalar `lr` and a text summary (prost);
/// with the rows a step-by-step reader makes of it: `(step, record, fields)`.
fn event_file(steps: i64) -> (Vec<u8>, Vec<Row>) {
    let value = |tag: &str, x: f32| SummaryValue {
        tag: tag.to_string(),
        simple_value: Some(x),
        metadata: None,
        tensor: None,
    };
    let event = |step: i64, v: SummaryValue| Event {
        wall_time: 1000.0 + step as f64,
        step,
        file_version: None,
        summary: Some(Summary { value: vec![v] }),
    };
    let mut file = record(
        &Event {
            wall_time: 1000.0,
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        }
        .encode_to_vec(),
    );
    let mut rows = Vec::new();
    let mut n = 1u64;
    for step in 0..steps {
        let (loss, kl) = (step as f32 * 0.25, 1.0 / (step as f32 + 1.0));
        let mut fields = vec![
            ("loss".to_string(), loss as f64),
            ("kl".to_string(), kl as f64),
        ];
        file.extend(record(&event(step, value("loss", loss)).encode_to_vec()));
        file.extend(record(&event(step, value("kl", kl)).encode_to_vec()));
        let first = n + 1;
        n += 2;
        if step % 7 == 3 {
            let mut t = scalar_tensor(dt::DOUBLE);
            t.double_val = vec![step as f64 * 1e-6];
            let mut v = value("lr", 0.0);
            v.simple_value = None;
            v.tensor = Some(Box::new(t));
            file.extend(record(&event(step, v).encode_to_vec()));
            fields.push(("lr".to_string(), step as f64 * 1e-6));
            let mut text = scalar_tensor(7);
            text.string_val = vec![b"a completion".to_vec()];
            let mut v = value("samples", 0.0);
            v.simple_value = None;
            v.tensor = Some(Box::new(text));
            v.metadata = Some(SummaryMetadata {
                plugin_data: Some(PluginData {
                    plugin_name: "text".into(),
                }),
                data_class: 0,
            });
            file.extend(record(&event(step, v).encode_to_vec()));
            n += 2;
        }
        rows.push((step, first, fields));
    }
    (file, rows)
}

type Got = (std::result::Result<(), String>, Vec<Row>, FileStats);

/// Where each record of `file` starts.
fn boundaries(file: &[u8]) -> Vec<usize> {
    let mut at = Vec::new();
    let mut pos = 0;
    while pos < file.len() {
        at.push(pos);
        let len = u64::from_le_bytes(file[pos..pos + 8].try_into().unwrap()) as usize;
        pos += 12 + len + 4;
    }
    at
}

/// `bytes` read with `chunk` bytes at a time and `part` records per parallel part.
fn read_all(bytes: &[u8], chunk: usize, part: usize) -> Got {
    let mut stats = FileStats::default();
    let mut batches = Vec::new();
    let mut sink = |b: super::super::rows::RowBatch| {
        batches.push(b);
        None
    };
    let res = {
        let mut w = RowWriter::new(&mut sink);
        let r = read_with(Path::new("ev"), bytes, &mut stats, &mut w, chunk, part);
        w.flush();
        r
    };
    let (mut names, mut rows) = (Vec::new(), Vec::new());
    for b in &batches {
        super::super::rows::to_records(b, &mut names, 0, &mut |r| {
            rows.push((r.step.unwrap_or(-1), r.line, r.fields.clone()));
        });
    }
    (res.map_err(|e| e.to_string()), rows, stats)
}

/// Chunk sizes that cut records at every place (inside a header, the data, the CRC)
/// and part sizes from one record to more than the file.
const SPLITS: [(usize, usize); 6] = [
    (1, 1),
    (13, 2),
    (29, 5),
    (100, 3),
    (1000, 64),
    (CHUNK, PART_RECORDS),
];

#[test]
fn parallel_decode_is_the_step_by_step_reading_at_every_split() {
    let (file, want) = event_file(60);
    for (chunk, part) in SPLITS {
        let (res, rows, stats) = read_all(&file, chunk, part);
        assert_eq!(res, Ok(()), "chunk {chunk} part {part}");
        assert_eq!(rows, want, "chunk {chunk} part {part}");
        assert_eq!(stats.bytes, file.len() as u64);
        assert_eq!(stats.lines, 1 + 120 + 2 * 9);
        assert_eq!(stats.text_summaries, 9);
        assert!(stats.bad_lines.is_empty());
    }
}

#[test]
fn a_record_cut_by_the_end_keeps_the_records_before_it() {
    let (file, want) = event_file(12);
    // The last record is step 11's `kl` (11 % 7 != 3): cut it in its header, in its
    // data and in its CRC.
    let start = *boundaries(&file).last().unwrap();
    for cut in [start + 5, start + 12, file.len() - 2] {
        let kept = &file[..cut];
        let mut want = want.clone();
        if let Some(r) = want.last_mut() {
            r.2.truncate(1);
        }
        let what = if cut - start < 12 {
            "record header"
        } else {
            "record data"
        };
        for (chunk, part) in SPLITS {
            let (res, rows, stats) = read_all(kept, chunk, part);
            assert_eq!(res, Ok(()));
            assert_eq!(rows, want, "cut {cut} chunk {chunk} part {part}");
            assert!(stats.truncated_last_line);
            assert_eq!(stats.bytes, cut as u64);
            let msg =
                format!("truncated last record at byte {start}: the file ends inside its {what}");
            assert_eq!(
                stats.bad_lines.first().map(|b| b.message.as_str()),
                Some(msg.as_str())
            );
        }
    }
}

#[test]
fn a_corrupt_record_in_the_middle_is_the_error_at_every_split() {
    let (file, _) = event_file(30);
    // Record boundaries, to corrupt record 40's data and then record 41's header.
    let at = boundaries(&file);
    let mut data = file.clone();
    data[at[39] + 14] ^= 0x40;
    let mut header = file.clone();
    header[at[40] + 2] ^= 1;
    // Both: the earlier record's error is the one reported.
    let mut both = data.clone();
    both[at[40] + 2] ^= 1;
    let want_data = "TFRecord data CRC-32C mismatch (record 40)".to_string();
    for (chunk, part) in SPLITS {
        for (bytes, want) in [(&data, &want_data), (&both, &want_data)] {
            let err = read_all(bytes, chunk, part).0.unwrap_err();
            assert!(
                err.contains(&want[..]) && err.contains(&format!("byte {}", at[39] + 12)),
                "{err}"
            );
        }
        let (res, rows, _) = read_all(&header, chunk, part);
        let err = res.unwrap_err();
        assert!(
            err.contains("length field CRC-32C mismatch (record 41")
                && err.contains(&format!("byte {}", at[40])),
            "{err}"
        );
        // The rows of records 1-40 were added before the error, at every split (the
        // buffer holding the bad header is framed while the one before it is decoded).
        let last_line = rows.iter().map(|r| r.1).max();
        assert!(!rows.is_empty() && last_line <= Some(40), "{last_line:?}");
        assert_eq!(
            rows,
            read_all(&header, 1 << 20, 1 << 20).1,
            "chunk {chunk} part {part}"
        );
    }
}

fn scalar_tensor(dtype: i32) -> TensorProto {
    TensorProto {
        dtype,
        tensor_shape: Some(TensorShape { dim: Vec::new() }),
        tensor_content: Vec::new(),
        half_val: Vec::new(),
        float_val: Vec::new(),
        double_val: Vec::new(),
        int_val: Vec::new(),
        string_val: Vec::new(),
        int64_val: Vec::new(),
        bool_val: Vec::new(),
        uint32_val: Vec::new(),
        uint64_val: Vec::new(),
    }
}

#[test]
fn tensor_scalars_of_every_encoding() {
    let mut t = scalar_tensor(dt::HALF);
    // numpy: np.float16(0.333).view(np.uint16) == 13652 == 0.3330078125
    t.half_val = vec![13652];
    assert_eq!(t.scalar(), Some(0.333_007_812_5));
    t.half_val.clear();
    t.tensor_content = 13652u16.to_le_bytes().to_vec();
    assert_eq!(t.scalar(), Some(0.333_007_812_5));
    let mut t = scalar_tensor(dt::INT64);
    t.tensor_content = (-7i64).to_le_bytes().to_vec();
    assert_eq!(t.scalar(), Some(-7.0));
    t.tensor_content.clear();
    t.int64_val = vec![1 << 40];
    assert_eq!(t.scalar(), Some((1u64 << 40) as f64));
    let mut t = scalar_tensor(dt::BFLOAT16);
    t.half_val = vec![0x3FC0]; // 1.5
    assert_eq!(t.scalar(), Some(1.5));
    let mut t = scalar_tensor(dt::DOUBLE);
    t.double_val = vec![f64::NAN];
    assert!(t.scalar().is_some_and(f64::is_nan));
    // A histogram-shaped tensor is not a scalar; nor is a string tensor.
    let mut t = scalar_tensor(dt::FLOAT);
    t.tensor_shape = Some(TensorShape {
        dim: vec![TensorDim { size: 3 }, TensorDim { size: 3 }],
    });
    t.float_val = vec![1.0; 9];
    assert_eq!(t.scalar(), None);
    assert_eq!(scalar_tensor(7).scalar(), None);
}
