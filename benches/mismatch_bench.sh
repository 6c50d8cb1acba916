#!/usr/bin/env bash
# mismatch against dumpdiff on one tree (issue 30): the 32 ranks x 2 micros x 64 rows x
# 8192 tokens NexRL step, timed by hyperfine, peak RSS by GNU time. See benches/README.md.
#
#   benches/mismatch_bench.sh TREE_DIR TAG
#   benches/mismatch_bench.sh /work/wt/h1/bench-data/bench32 session15
#
# TREE_DIR is generated when missing (benches/gen_real_step.py --ranks 32 --micros 2
# --rows 64 --length 8192 --no-echo: 818 MB self-hosted + 2.3 GB weaver; keep it out of
# git and delete it afterwards). Environment: BIN (default the release builds under
# $CARGO_TARGET_DIR or target/), RUNS (default 5), RESULTS (default benches/results).
set -euo pipefail
cd "$(dirname "$0")/.."
TREE=${1:?usage: benches/mismatch_bench.sh TREE_DIR TAG}
TAG=${2:?usage: benches/mismatch_bench.sh TREE_DIR TAG}
command -v hyperfine > /dev/null || { echo "needs hyperfine" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "needs GNU time at /usr/bin/time" >&2; exit 2; }
if [ -z "${BIN:-}" ]; then
  cargo build -q --release --bin dumpdiff --bin mismatch
  BIN=${CARGO_TARGET_DIR:-target}/release
fi
RUNS=${RUNS:-5}
RESULTS=${RESULTS:-benches/results}
if [ ! -d "$TREE/weaver_pt" ]; then
  python3 benches/gen_real_step.py "$TREE" --ranks 32 --micros 2 --rows 64 --length 8192 --no-echo
fi
DD="$BIN/dumpdiff --self-hosted-dir $TREE/self_hosted_pt --weaver-dir $TREE/weaver_pt --step 0 --format json"
MM="$BIN/mismatch $TREE/weaver_pt --pair old:current --step 0 --format json"
hyperfine -N --warmup 1 --runs "$RUNS" -i --export-json "$RESULTS/mismatch32-$TAG.json" \
  -n dumpdiff "$DD" -n mismatch "$MM" -n mismatch-no-whatif "$MM --no-whatif"
for c in "$DD" "$MM" "$MM --no-whatif"; do
  /usr/bin/time -f "%M KB peak RSS, %e s, %U user, %S sys: $c" $c > /dev/null 2> >(tail -1 >&2) || true
done
