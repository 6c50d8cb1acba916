#!/usr/bin/env bash
# Every speed comparison in one table: our tools against the python/torch/polars/jq way of
# doing the same job, and against `cat` of the same files (the page-cache read limit).
# Generates missing inputs (needs python3 with torch, numpy, polars; jq optional) and
# builds the release binaries into $CARGO_TARGET_DIR (default target/bench-build).
#
#   benches/compare.sh            # REPEATS=3 (best of), 1 GB steps.jsonl, 290 MB dump trees
#   REPEATS=1 benches/compare.sh  # quicker
#   SECTIONS=trackers benches/compare.sh   # only some of: dumpdiff read logscan kernels trackers
#   SECTIONS=trackers LOGSCAN_BIN=/tmp/logscan benches/compare.sh   # time that binary, no build
#
# trackers: a 1 GB TensorBoard event file and a 1 GB W&B `.wandb` file (benches/gen_trackers.py,
# written into $TRK_DATA, default /work/tmp-trackers, deleted afterwards unless KEEP=1) scanned
# end to end by `logscan`, beside tbparse and wandb's own `Record` class on 64 MB inputs
# ($TRK_REF_MB; the python readers run at a few MB/s). Median of REPEATS wall seconds, MB/s
# and the median peak RSS (needs python3 with tensorboard, tbparse, wandb, crc32c).
#
# Columns: ours and theirs as wall seconds (best of REPEATS, page cache warm) and MB/s;
# ratio = theirs / ours (> 1: we are faster); peak RSS (MB) of our process; cat = the
# seconds `cat FILES > /dev/null` takes, and ours / cat (1.0 would be reading speed).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/bench-build}
REL=$CARGO_TARGET_DIR/release
DD=${DD_DIR:-/tmp/dd_large}
STEPS=${STEPS:-bench-data/steps_1024mb.jsonl}
REPEATS=${REPEATS:-3}
SECTIONS=${SECTIONS:-dumpdiff read logscan kernels trackers}
TRK_DATA=${TRK_DATA:-/work/tmp-trackers}
TRK_MB=${TRK_MB:-1024}
TRK_REF_MB=${TRK_REF_MB:-64}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
has() { [[ " $SECTIONS " == *" $1 "* ]]; }
touch "$OUT/rows"

if [ "$SECTIONS" = trackers ] && [ -n "${LOGSCAN_BIN:-}" ]; then
  :  # a logscan built elsewhere (a target dir shared by several checkouts is rebuilt under us)
elif [ "$SECTIONS" = trackers ]; then
  cargo build -q --release --locked --bin logscan
else
  cargo build -q --release --bins --benches
fi
if has dumpdiff || has read; then
  [ -d "$DD/self_hosted_pt" ] || python3 fixtures/gen/make_dumps.py --large "$DD"
fi
if has logscan; then
  mkdir -p "$(dirname "$STEPS")"
  [ -s "$STEPS" ] || python3 benches/gen_steps.py "$STEPS" 1024
fi
bench_bin() { find "$REL/deps" -maxdepth 1 -type f -executable -name "$1-*" -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2; }

# best wall seconds of REPEATS runs of "$@" (stdout discarded). Our tools exit 1 on
# findings, so `best` ignores the exit code; `best_ok` is for baselines, which must succeed.
best() { _best 0 "$@"; }
best_ok() { _best 1 "$@"; }
_best() {
  local check=$1 b=""; shift
  for _ in $(seq "$REPEATS"); do
    local s e rc=0
    s=$(date +%s.%N); "$@" > /dev/null 2> "$OUT/err" || rc=$?; e=$(date +%s.%N)
    if [ "$check" = 1 ] && [ "$rc" != 0 ]; then
      echo "baseline failed ($rc): $*" >&2; cat "$OUT/err" >&2; exit 1
    fi
    b=$(python3 -c "print(min(float('${b:-inf}'), $e - $s))")
  done
  echo "$b"
}
# peak resident set of one run of "$@", in MB ("-" when GNU time is missing)
peak() {
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f %M -o "$OUT/rss" "$@" > /dev/null 2>&1 || true
    tail -1 "$OUT/rss" | awk '{printf "%.0f", $1 / 1024}'   # after any "exited with" line
  else
    echo -
  fi
}
row() { echo "$*" >> "$OUT/rows"; }   # task ours_s theirs_s baseline_name mb peak_mb cat_s

# --- dumpdiff vs the python+torch comparator, on the files both read
if has dumpdiff; then
DD_FILES=$(find "$DD"/self_hosted_pt/{forward_data,loss,old_log_probs} "$DD"/weaver_pt/{forward_data,loss,is_loss_debug} -type f | sort)
DD_MB=$(du -cb $DD_FILES | tail -1 | awk '{print $1 / 1e6}')
cat $DD_FILES > /dev/null
DD_ARGS=(--self-hosted-dir "$DD/self_hosted_pt" --weaver-dir "$DD/weaver_pt" --step 0 --format json)
row dumpdiff "$(best "$REL/dumpdiff" "${DD_ARGS[@]}")" \
    "$(best_ok python3 benches/dumpdiff_baseline.py "$DD/self_hosted_pt" "$DD/weaver_pt" 0)" \
    python+torch "$DD_MB" "$(peak "$REL/dumpdiff" "${DD_ARGS[@]}")" "$(best cat $DD_FILES)"
fi

# --- reading both trees: parse (zero-copy) and decode every tensor to f64, vs torch.load
if has read; then
READ=$(bench_bin read_tree)
for tree in "$DD/self_hosted_pt" "$DD/weaver_pt"; do
  files=$(find "$tree" -name '*.pt' | sort)
  cat $files > /dev/null
  ours=$("$READ" "$tree" "$REPEATS")
  theirs=$(python3 benches/torch_load.py "$tree" "$REPEATS")
  mb=$(sed -n 's/.* MB=\([0-9.]*\) .*/\1/p' <<< "$ours")
  c=$(best cat $files)
  name=$(basename "$tree")
  row "read:$name(parse)" "$(sed -n 's/.*parse_s=\([0-9.]*\).*/\1/p' <<< "$ours")" \
      "$(sed -n 's/.*load_s=\([0-9.]*\).*/\1/p' <<< "$theirs")" torch.load "$mb" - "$c"
  row "read:$name(to-f64)" "$(sed -n 's/.*decode_par_s=\([0-9.]*\).*/\1/p' <<< "$ours")" \
      "$(sed -n 's/.*decode_s=\([0-9.]*\).*/\1/p' <<< "$theirs")" torch.load+.double "$mb" - "$c"
done
fi

# --- logscan --zero-loss --nan-grad vs python-polars and jq doing the same filter
if has logscan; then
ST_MB=$(stat -c %s "$STEPS" | awk '{print $1 / 1e6}')
cat "$STEPS" > /dev/null
LS_ARGS=("$STEPS" --zero-loss --nan-grad --no-color)
LS=$(best "$REL/logscan" "${LS_ARGS[@]}")
LS_PEAK=$(peak "$REL/logscan" "${LS_ARGS[@]}")
ST_CAT=$(best cat "$STEPS")
cat > "$OUT/polars_filter.py" <<'PY'
import sys, polars as pl
# polars' NDJSON reader rejects bare NaN: it must be rewritten first (part of the cost).
text = open(sys.argv[1]).read().replace("NaN", "null")
df = pl.read_ndjson(text.encode(), infer_schema_length=None)
zero = df.filter((pl.col("train_loss").abs() <= 1e-8)
                 & (pl.col("metrics").struct.field("reward_std") <= 1e-6))
nan = df.filter(pl.col("grad_norm").is_null() | pl.col("grad_norm").is_nan())
print(zero.height, nan.height)
PY
row logscan "$LS" "$(best_ok python3 "$OUT/polars_filter.py" "$STEPS")" python-polars "$ST_MB" "$LS_PEAK" "$ST_CAT"
if command -v jq > /dev/null; then
  JQ_FILTER='select(((.train_loss | fabs) <= 1e-8 and .metrics.reward_std <= 1e-6) or (.grad_norm | isnan)) | .step'
  row logscan "$LS" "$(REPEATS=1 best_ok jq -c "$JQ_FILTER" "$STEPS")" jq "$ST_MB" "$LS_PEAK" "$ST_CAT"
fi
fi

# --- losscheck kernels vs PyTorch CPU (2 threads), 256 x 8192 tokens: the sum over presets
if has kernels; then
KB=$(bench_bin kernels_bench)
ours=$("$KB" "$REPEATS" 256 8192)
# the same glibc malloc settings as ours (kernels_bench calls alloc::keep_freed_memory())
theirs=$(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 \
  python3 benches/kernels_torch.py "$REPEATS" 256 8192)
for prec in f64 f32; do
  sum() { grep "precision=$prec" | sed -n 's/.* ms=\([0-9.]*\).*/\1/p' | awk '{s += $1} END {print s / 1000}'; }
  n=$(grep -c "precision=$prec" <<< "$ours")
  row "kernels($prec,$n-runs)" "$(sum <<< "$ours")" "$(sum <<< "$theirs")" pytorch-cpu - - -
done
fi

# --- tracker files: logscan end to end on 1 GB, tbparse / wandb's Record on 64 MB
# median wall seconds and median peak RSS (MB) of REPEATS runs of "$@"
median_run() {
  local walls=() rss=()
  for _ in $(seq "$REPEATS"); do
    /usr/bin/time -f '%e %M' -o "$OUT/tm" "$@" > /dev/null 2> "$OUT/err" || true
    read -r w m < <(tail -1 "$OUT/tm")
    walls+=("$w"); rss+=("$m")
  done
  python3 -c "import statistics as s, sys; a = sys.argv[1:]; n = len(a) // 2; \
print(s.median(map(float, a[:n])), round(s.median(map(float, a[n:])) / 1024))" "${walls[@]}" "${rss[@]}"
}
trk_bytes() { find "$1" -type f \( -name 'events.out.tfevents.*' -o -name '*.wandb' \) -printf '%s\n' | awk '{s += $1} END {print s / 1e6}'; }
trk_gen() { # kind size_mb -> dir
  local dir=$TRK_DATA/$1_$2
  [ -d "$dir" ] || python3 benches/gen_trackers.py "$1" "$dir" "$2" > /dev/null
  echo "$dir"
}
if has trackers; then
  mkdir -p "$TRK_DATA"
  [ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$OUT" "$TRK_DATA"/tfevents_* "$TRK_DATA"/wandb_*' EXIT
  : > "$OUT/trk"
  for kind in tfevents wandb; do
    big=$(trk_gen "$kind" "$TRK_MB"); ref=$(trk_gen "$kind" "$TRK_REF_MB")
    find "$big" "$ref" -type f -exec cat {} + > /dev/null
    if [ "$kind" = tfevents ]; then
      theirs=(python3 -c "from tbparse import SummaryReader; SummaryReader('$ref').scalars"); name=tbparse
    else
      theirs=(python3 benches/gen_trackers.py read-wandb "$ref" 0); name=wandb-Record
    fi
    ls_bin=${LOGSCAN_BIN:-$REL/logscan}
    echo "logscan-$kind $(trk_bytes "$big") $(median_run "$ls_bin" "$big" --format json)" >> "$OUT/trk"
    echo "logscan-$kind $(trk_bytes "$ref") $(median_run "$ls_bin" "$ref" --format json)" >> "$OUT/trk"
    echo "$name $(trk_bytes "$ref") $(median_run "${theirs[@]}")" >> "$OUT/trk"
  done
  python3 - "$OUT/trk" <<'PY'
import sys
print(f"{'tracker reader':18} {'MB':>7} {'wall s (median)':>16} {'MB/s':>7} {'peak RSS MB':>12}")
for line in open(sys.argv[1]):
    name, mb, wall, rss = line.split()
    mb, wall = float(mb), float(wall)
    print(f"{name:18} {mb:7.0f} {wall:16.2f} {mb / wall if wall else float('nan'):7.0f} {rss:>12}")
PY
fi
[ -s "$OUT/rows" ] || exit 0

python3 - "$OUT/rows" <<'PY'
import sys
print(f"{'task':26} {'ours s':>8} {'MB/s':>7} {'baseline':>19} {'theirs s':>9} {'MB/s':>7} "
      f"{'ratio':>6} {'peak MB':>8} {'cat s':>7} {'ours/cat':>8}")
for line in open(sys.argv[1]):
    task, ours, theirs, name, mb, peak, cat = line.split()
    ours, theirs = float(ours), float(theirs)
    rate = lambda s: f"{float(mb) / s:7.0f}" if mb != "-" and s > 0 else f"{'-':>7}"
    vs_cat = f"{ours / float(cat):8.1f}" if cat != "-" else f"{'-':>8}"
    cat_s = f"{float(cat):7.3f}" if cat != "-" else f"{'-':>7}"
    print(f"{task:26} {ours:8.3f} {rate(ours)} {name:>19} {theirs:9.3f} {rate(theirs)} "
          f"{theirs / ours:6.2f} {peak:>8} {cat_s} {vs_cat}")
PY
