#!/usr/bin/env bash
# Side-by-side bench: logscan vs python-polars read_ndjson + the same zero-loss/NaN filter
# vs `wc -l`, on a generated ~1 GB DebugTrainer steps.jsonl (not committed; written under
# bench-data/, which .gitignore excludes).
#
#   cargo build --release --bin logscan     # ~25 min cold on 2 cores
#   benches/logscan_bench.sh [SIZE_MB]      # default 1024; LOGSCAN_BIN=path to pick a binary
#
# Prints MB/s for each, logscan's peak RSS (with --zero-loss --nan-grad, and with every
# detector), and the ratios logscan/polars and logscan/wc.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MB=${1:-1024}
BIN=${LOGSCAN_BIN:-target/release/logscan}
DATA=bench-data/steps_${SIZE_MB}mb.jsonl
mkdir -p bench-data
[ -x "$BIN" ] || { echo "build first: cargo build --release --bin logscan" >&2; exit 2; }

[ -s "$DATA" ] || python3 benches/gen_steps.py "$DATA" "$SIZE_MB"
BYTES=$(stat -c %s "$DATA")
MB=$(python3 -c "print($BYTES/1048576)")
cat "$DATA" > /dev/null   # warm the page cache for every contender

t() { local s e; s=$(date +%s.%N); "$@" > /dev/null; e=$(date +%s.%N); python3 -c "print($e-$s)"; }
# Peak resident set of a command, in MB (GNU time's %M is in KB).
rss() { { /usr/bin/time -f %M "$@" 2>&1 > /dev/null || true; } | tail -1 | awk '{printf "%.0f", $1 / 1024}'; }

T_WC=$(t wc -l "$DATA")
T_LS=$(t "$BIN" "$DATA" --zero-loss --nan-grad --fail-on critical --no-color)
T_ALL=$(t "$BIN" "$DATA" --fail-on critical --no-color)
if [ -x /usr/bin/time ]; then
  M_LS=$(rss "$BIN" "$DATA" --zero-loss --nan-grad --fail-on critical --no-color)
  M_ALL=$(rss "$BIN" "$DATA" --fail-on critical --no-color)
else
  M_LS=-1 M_ALL=-1
fi
T_PL=$(t python3 - "$DATA" <<'PY'
import sys, polars as pl
# polars' NDJSON reader rejects bare NaN: it must be rewritten first (part of the cost).
text = open(sys.argv[1]).read().replace("NaN", "null")
df = pl.read_ndjson(text.encode(), infer_schema_length=None)
zero = df.filter((pl.col("train_loss").abs() <= 1e-8)
                 & (pl.col("metrics").struct.field("reward_std") <= 1e-6))
nan = df.filter(pl.col("grad_norm").is_null() | pl.col("grad_norm").is_nan())
print(zero.height, nan.height)
PY
)
python3 - "$MB" "$T_WC" "$T_LS" "$T_ALL" "$T_PL" "$M_LS" "$M_ALL" <<'PY'
import sys
mb, wc, ls, al, pl, m_ls, m_all = map(float, sys.argv[1:])
print(f"file: {mb:.0f} MB")
for name, t, m in [("wc -l", wc, -1), ("logscan --zero-loss --nan-grad", ls, m_ls),
                   ("logscan (every detector)", al, m_all),
                   ("python-polars read_ndjson + filter", pl, -1)]:
    peak = f"  peak RSS {m:.0f} MB" if m >= 0 else ""
    print(f"{name:40s} {t:8.2f} s {mb / t:9.1f} MB/s{peak}")
print(f"logscan / polars speed ratio: {pl / ls:.2f}x   logscan / wc -l: {wc / ls:.2f}x")
PY

# hyperfine (when installed): the same two logscan runs on steps.jsonl, and logscan on each
# tracker input found under $TRACKERS (default /tmp/rlf_trackers_bench, written by
# benches/gen_trackers.py: tfevents_<MB>/, wandb_<MB>/), exported as JSON under
# benches/results/ (MB/s = size / mean).
if command -v hyperfine > /dev/null; then
  mkdir -p benches/results
  RUNS=${RUNS:-5}
  hyperfine --warmup 1 --runs "$RUNS" -N --ignore-failure \
    --export-json "benches/results/logscan_steps_${SIZE_MB}mb.json" \
    "$BIN $DATA --zero-loss --nan-grad --fail-on critical --no-color" \
    "$BIN $DATA --fail-on critical --no-color"
  TRACKERS=${TRACKERS:-/tmp/rlf_trackers_bench}
  for dir in "$TRACKERS"/tfevents_"$SIZE_MB" "$TRACKERS"/wandb_"$SIZE_MB"; do
    [ -d "$dir" ] || continue
    kind=$(basename "$dir")
    BYTES_T=$(du -sb "$dir" | cut -f1)
    echo "$kind: $BYTES_T bytes"
    hyperfine --warmup 1 --runs "$RUNS" -N --ignore-failure \
      --export-json "benches/results/logscan_${kind}.json" \
      "$BIN $dir --fail-on critical --no-color"
  done
fi
