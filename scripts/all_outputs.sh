#!/usr/bin/env bash
# Every report the four tools write on the shipped fixtures and, where it is beside the
# repository, on the shared corpus — one file per run — so that a refactor meant to change
# nothing can be checked byte for byte:
#
#   scripts/all_outputs.sh BIN_DIR OUT_BEFORE   # build of the old commit
#   scripts/all_outputs.sh BIN_DIR OUT_AFTER    # build of the new one
#   diff -r OUT_BEFORE OUT_AFTER && echo identical
#
# dumpdiff / losscheck / --inspect runs come from scripts/fixture_outputs.sh; this adds
# logscan (every fixture log, tracker and corpus file, each format, --compare) and
# postmortem (every fixture run, each format, the folder it writes).
set -uo pipefail
BIN=$(cd "$1" && pwd)
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
cd "$(dirname "$0")/.."
scripts/fixture_outputs.sh "$BIN" "$OUT" > /dev/null
n=0
run() {
  local name=$1; shift
  "$@" > "$OUT/$name.out" 2> "$OUT/$name.err.tmp"
  { echo "exit $?"; cat "$OUT/$name.err.tmp"; } > "$OUT/$name.err"
  rm -f "$OUT/$name.err.tmp"
  n=$((n + 1))
}
slug() { echo "$1" | tr '/ ' '__'; }
corpus="${RLF_CORPUS_DIR:-../shared/corpus}"

# logscan: each fixture log folder/file and each corpus entry, in every format.
inputs=(fixtures/logs/* fixtures/logs/text/* fixtures/runs/2* fixtures/trackers/*/*)
[ -d "$corpus" ] && inputs+=("$corpus"/real-logs/* "$corpus"/droid-finetuning/2*)
for p in "${inputs[@]}"; do
  case "$p" in *README.md|*manifest.json) continue;; esac
  s=$(slug "${p#"$corpus"/}")
  for fmt in table json markdown; do
    COLUMNS=100 run "logscan_${s}_${fmt}" "$BIN/logscan" "$p" --format "$fmt"
  done
done
T=fixtures/trackers
run logscan_compare_tb_wandb "$BIN/logscan" --compare "$T/tb/run_a" "$T/wandb/run_b" --format json
run logscan_compare_tb_csv_table "$BIN/logscan" --compare "$T/tb" "$T/csv"
run logscan_compare_runs_md "$BIN/logscan" --compare fixtures/runs/20251009-091500 \
    fixtures/runs/20251009-130000 --format markdown

# postmortem: each run, each format on stdout, and the folder it writes.
for r in fixtures/runs/2* fixtures/runs/partial_bundle/*; do
  s=$(slug "$r")
  for fmt in markdown json; do
    run "postmortem_${s}_${fmt}" "$BIN/postmortem" "$r" --format "$fmt" --output "$OUT/pmf_$s"
  done
  rm -rf "$OUT/pm_$s"
  run "postmortem_${s}_dir" "$BIN/postmortem" "$r" --output "$OUT/pm_$s"
  sed -i "s#$OUT/#OUT/#g" "$OUT/postmortem_${s}_dir.out"
done
run postmortem_dumps "$BIN/postmortem" fixtures/runs/20251009-091500 \
    --dumps fixtures/dumps/weaver_faulty_pt --step 0 --format json --output "$OUT/pmd"
echo "$n more runs written to $OUT"
