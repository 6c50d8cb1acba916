//! Reading speed of a dump tree: every file parsed (zip + restricted unpickler, storages
//! memory-mapped) and every tensor decoded to f64, sequentially and in parallel.
//! Run through `benches/read_bench.sh`, which puts `torch.load` of the same files beside it.
//!
//! Usage: `cargo bench --bench read_tree -- DIR [REPEATS]`

use std::path::PathBuf;
use std::time::Instant;

use rayon::prelude::*;
use rlforensics::Value;
use rlforensics::{formats::read_any, producers::layout::DumpTree};

/// Decode every tensor (and numeric list) under `v` to f64; returns elements decoded.
fn decode_all(v: &Value) -> usize {
    match v {
        Value::Tensor(t) => {
            let x = t.to_f64_vec();
            std::hint::black_box(&x);
            x.len()
        }
        Value::Dict(items) => items.iter().map(|(_, x)| decode_all(x)).sum(),
        Value::List(items) | Value::Tuple(items) => items.iter().map(decode_all).sum(),
        _ => 0,
    }
}

fn best_of<F: FnMut() -> usize>(repeats: usize, mut f: F) -> (f64, usize) {
    let mut best = f64::INFINITY;
    let mut n = 0;
    for _ in 0..repeats {
        let t = Instant::now();
        n = f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    (best, n)
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let Some(dir) = args.first().map(PathBuf::from) else {
        eprintln!("usage: cargo bench --bench read_tree -- DIR [REPEATS]");
        std::process::exit(2);
    };
    let repeats: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let tree = match DumpTree::discover(&dir) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let files: Vec<PathBuf> = tree.files().iter().map(|f| f.path.clone()).collect();
    let mb = tree.total_bytes() as f64 / 1e6;
    let read = |p: &PathBuf| read_any(p).unwrap_or_else(|e| panic!("{e}"));
    let (parse, _) = best_of(repeats, || {
        for p in &files {
            std::hint::black_box(read(p));
        }
        files.len()
    });
    let (seq, elems) = best_of(repeats, || files.iter().map(|p| decode_all(&read(p))).sum());
    let (par, _) = best_of(repeats, || {
        files.par_iter().map(|p| decode_all(&read(p))).sum()
    });
    println!(
        "rust files={} MB={mb:.2} elements={elems} parse_s={parse:.4} parse_MBps={:.0} \
         decode_seq_s={seq:.4} decode_seq_MBps={:.0} decode_par_s={par:.4} decode_par_MBps={:.0}",
        files.len(),
        mb / parse,
        mb / seq,
        mb / par
    );
}
