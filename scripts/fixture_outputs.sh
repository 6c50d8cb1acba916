#!/usr/bin/env bash
# Every dumpdiff / losscheck / `dumpdiff --inspect` output on the shipped fixtures, one file
# per run (stdout, plus the exit code and stderr), so that two builds can be compared byte
# for byte: a change meant to be invisible (a faster reader, a new value representation)
# must leave every file identical.
#
#   scripts/fixture_outputs.sh BIN_DIR OUT_DIR    # BIN_DIR holds dumpdiff and losscheck
#   diff -r OUT_BEFORE OUT_AFTER && echo identical
#
# Run from anywhere; paths in the outputs are relative to the repository root.
set -uo pipefail
BIN=$(cd "$1" && pwd)
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
cd "$(dirname "$0")/.."
D=fixtures/dumps
n=0
# run NAME CMD...: stdout to NAME.out, "exit N" and stderr to NAME.err
run() {
  local name=$1; shift
  "$@" > "$OUT/$name.out" 2> "$OUT/$name.err.tmp"
  { echo "exit $?"; cat "$OUT/$name.err.tmp"; } > "$OUT/$name.err"
  rm -f "$OUT/$name.err.tmp"
  n=$((n + 1))
}
dd() { "$BIN/dumpdiff" "$@"; }
lc() { "$BIN/losscheck" "$@"; }

# dumpdiff on every pairing of the trees, JSON report (stdout and --output) and table.
pairs=(
  "weaver_pt|--weaver-dir $D/weaver_pt"
  "weaver_faulty_pt|--weaver-dir $D/weaver_faulty_pt"
  "remote_pt|--remote-api-dir $D/remote_api_pt"
  "remote_weaver_faulty_pt|--remote-api-dir $D/remote_api_pt --weaver-dir $D/weaver_faulty_pt"
  "remote_weaver_pt|--remote-api-dir $D/remote_api_pt --weaver-dir $D/weaver_pt"
)
for p in "${pairs[@]}"; do
  name=${p%%|*}; args=${p#*|}
  # shellcheck disable=SC2086
  run "dumpdiff_${name}_json" dd --self-hosted-dir $D/self_hosted_pt $args --step 0 --format json \
      --output "$OUT/dumpdiff_${name}_report.json"
  # shellcheck disable=SC2086
  run "dumpdiff_${name}_table" dd --self-hosted-dir $D/self_hosted_pt $args --step 0
  # shellcheck disable=SC2086
  run "dumpdiff_${name}_noadj" dd --self-hosted-dir $D/self_hosted_pt $args --step 0 --format json \
      --no-adjudicate
done
run dumpdiff_jsonl_all dd --self-hosted-dir $D/self_hosted_jsonl --weaver-dir $D/weaver_jsonl \
    --remote-api-dir $D/remote_api_jsonl --step 0 --format json
run dumpdiff_jsonl_weaver_pt dd --self-hosted-dir $D/self_hosted_jsonl --weaver-dir $D/weaver_faulty_pt \
    --step 0 --format json
run dumpdiff_markdown dd --self-hosted-dir $D/self_hosted_pt --weaver-dir $D/weaver_faulty_pt \
    --remote-api-dir $D/remote_api_pt --step 0 --format markdown
run dumpdiff_ranks dd --self-hosted-dir $D/self_hosted_pt --weaver-dir $D/weaver_faulty_pt \
    --step 0 --format json --ranks 3,5-7 --micros 1
run dumpdiff_tol dd --self-hosted-dir $D/self_hosted_pt --weaver-dir $D/weaver_faulty_pt \
    --step 0 --format json --tol-file fixtures/tolerances.toml
run dumpdiff_adv_grpo dd --self-hosted-dir $D/self_hosted_pt --weaver-dir $D/weaver_pt \
    --step 0 --format json --preset trl-grpo
run dumpdiff_step_missing dd --self-hosted-dir $D/self_hosted_pt --weaver-dir $D/weaver_pt --step 5

# losscheck on every tree that has loss inputs, two presets, JSON and table.
for tree in self_hosted_pt self_hosted_jsonl weaver_pt weaver_faulty_pt weaver_jsonl remote_api_pt; do
  for preset in nexrl-is trl-grpo; do
    run "losscheck_${tree}_${preset}" lc --dump-dir $D/$tree --step 0 --preset $preset --format json
  done
  run "losscheck_${tree}_table" lc --dump-dir $D/$tree --step 0
done

# --inspect of every fixture file and dump folder.
while IFS= read -r f; do
  run "inspect_$(echo "$f" | tr '/' '_')" dd --inspect "$f"
done < <(find fixtures/dumps fixtures/tensors fixtures/corrupt -type f ! -name '*.json' | sort)
for tree in "$D"/*; do
  run "inspect_tree_$(basename "$tree")" dd --inspect "$tree"
done
run inspect_tree_step dd --inspect "$D/self_hosted_pt" --step -1
echo "$n runs written to $OUT"
