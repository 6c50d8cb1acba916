//! Tests of the CSV reader (`csv.rs`): the parallel parse against the `csv` crate reading
//! the whole table (chunk 0), at every chunk and part size.

use super::*;
use crate::logs::trackers::rows::{read_bit_rows, BitRow as Row};

/// What reading `text` with `sizes` gives: the result (its message), the statistics (as
/// `Debug`), the keys in interning order and the rows.
fn read_csv(text: &[u8], sizes: (usize, usize)) -> (String, String, Vec<String>, Vec<Row>) {
    let path = Path::new("runs/metrics.csv");
    let mut stats = FileStats::default();
    let (res, names, out) = read_bit_rows(|w| read_with(path, text, &mut stats, w, sizes));
    let res = match res {
        Ok(()) => "ok".to_string(),
        Err(e) => e.to_string(),
    };
    (res, format!("{stats:?}"), names, out)
}

/// Every chunk and part size up to past the table's length reads `text` as the `csv`
/// crate reading it whole does.
fn same_at_every_size(text: &[u8]) -> (String, String, Vec<String>, Vec<Row>) {
    let whole = read_csv(text, (0, 0));
    for chunk in 1..text.len() + 2 {
        for part in [1, 2, 3, 5, 8, 13, 21, 34, text.len() + 1] {
            assert_eq!(
                read_csv(text, (chunk, part)),
                whole,
                "chunk {chunk} part {part}"
            );
        }
    }
    whole
}

#[test]
fn every_part_size_gives_the_one_piece_rows() {
    // Empty cells, non-finite and boolean values, a bad and a float step, short and long
    // rows, a key first seen late, a last line without its newline.
    let text = b"step,loss,kl,_timestamp,,flag\n\
        0,1.5,,1700000000.5,9,true\n\
        1,nan,0.25,,,false\n\
        x,2,3\n\
        3.0,inf,-inf,1700000003,1,\n\
        4\n\
        5, 0.5 ,1e-3,,,TRUE,7,8\n\
        6,,,,,\n\
        7,-0.0";
    let (res, _, names, rows) = same_at_every_size(text);
    assert_eq!(res, "ok");
    assert_eq!(names, ["loss", "flag", "kl"]);
    let lines: Vec<u64> = rows.iter().map(|r| r.2).collect();
    assert_eq!(lines, [2, 3, 5, 7, 9]);
    assert_eq!(rows[2].0, Some(3));
}

#[test]
fn quoted_field_with_a_newline_is_one_record() {
    let text = b"step,note,loss\n0,a,1\n1,\"two\nlines, one field\",2\n2,b,3\n3,c,4\n";
    let (res, stats, _, rows) = same_at_every_size(text);
    assert_eq!(res, "ok");
    let lines: Vec<(Option<i64>, u64)> = rows.iter().map(|r| (r.0, r.2)).collect();
    assert_eq!(
        lines,
        [(Some(0), 2), (Some(1), 3), (Some(2), 5), (Some(3), 6)]
    );
    assert!(stats.contains("lines: 6"), "{stats}");
}

#[test]
fn cut_last_line_is_read_as_its_cells() {
    // A CSV has no end marker: a cut last line is the cells it has (as the `csv` crate
    // reads it), at every split.
    let text = b"step,loss,kl\n0,1,2\n1,3,4\n2,5";
    let (res, stats, _, rows) = same_at_every_size(text);
    assert_eq!(res, "ok");
    assert_eq!(
        rows.last().map(|r| (r.0, r.2, r.3.len())),
        Some((Some(2), 4, 1))
    );
    assert!(stats.contains(&format!("bytes: {}", text.len())), "{stats}");
}

#[test]
fn blank_lines_and_crlf_read_as_the_csv_crate_reads_them() {
    same_at_every_size(b"step,loss\n0,1\n\n1,2\n\n\n2,3\n\n");
    same_at_every_size(b"step,loss\r\n0,1\r\n1,2\r\n2,3\r\n");
    same_at_every_size(b"\nstep,loss\n0,1\n1,2\n");
    same_at_every_size(b"step,loss\n0,1\n1,2\r3,4\n");
}

#[test]
fn bad_step_is_a_bad_line_with_its_number() {
    let text = b"step,loss\n0,1\n1,2\nnope,3\n3,4\n";
    let (_, stats, _, _) = same_at_every_size(text);
    assert!(
        stats.contains("line: 4, message: \"step \\\"nope\\\" is not an integer\""),
        "{stats}"
    );
}

#[test]
fn not_utf8_error_names_file_and_line() {
    let mut text = b"step,loss\n".to_vec();
    for s in 0..30 {
        text.extend_from_slice(format!("{s},{s}.5\n").as_bytes());
    }
    text.extend_from_slice(b"30,\xff\n31,1\n");
    let (res, _, _, rows) = same_at_every_size(&text);
    assert!(res.starts_with("runs/metrics.csv: line 32: "), "{res}");
    assert!(
        res.contains("record 31 (line 32, field: 1, byte: "),
        "{res}"
    );
    assert_eq!(rows.len(), 30);
}

#[test]
fn plain_cells_read_by_the_number_parse_equal_the_trimmed_cells() {
    // Cells the number parse reads to their comma, cells it stops inside (an exponent
    // without digits, a space, a second dot), and step cells around the 18 digits the
    // plain step takes: each as the `csv` crate's cells read through `str::parse`.
    let text = b"step,loss,kl,time\n\
        0012,1e5,-2.5e-3,1700000000.25\n\
        1,1e,1.,-\n\
        2,1.5 ,-.5,NaN\n\
        3, 7,1.2.3,00012\n\
        123456789012345678,0.6000000000000001,-0,1e400\n\
        1234567890123456789,9,8,7\n\
        -5,+1,.5,inf\n\
        6,12345678901234567890123,0.1000000000000000055511151231257827,nan\n\
        7,true,FALSE,\n";
    let (res, stats, names, rows) = same_at_every_size(text);
    assert_eq!(res, "ok");
    assert_eq!(names, ["loss", "kl"]);
    let steps: Vec<Option<i64>> = rows.iter().map(|r| r.0).collect();
    assert_eq!(
        steps,
        [
            Some(12),
            Some(1),
            Some(2),
            Some(3),
            Some(123456789012345678),
            Some(1234567890123456789),
            Some(-5),
            Some(6),
            Some(7)
        ]
    );
    assert_eq!(rows[0].1, Some(1700000000.25f64.to_bits()));
    assert_eq!(rows[0].3[0].1, 1e5f64.to_bits());
    assert_eq!(rows[1].3.len(), 1, "{:?}", rows[1]);
    assert!(!stats.contains("bad_lines: [("), "{stats}");
}
