#!/usr/bin/env bash
# dumpdiff on one realistic step, timed by hyperfine beside NexRL's own comparator, with
# the JSON kept under benches/results/ and peak RSS from GNU time. See benches/README.md.
#
#   benches/hyperfine_step.sh TREE_DIR LABEL [gen_real_step.py options]
#   benches/hyperfine_step.sh bench-data/echo   echo                                # echoed
#   benches/hyperfine_step.sh bench-data/noecho noecho --no-echo                    # inferred
#   benches/hyperfine_step.sh bench-data/dyn    dyn --no-echo --dynamic-micros      # + dynamic
#
# TREE_DIR is generated when missing (benches/gen_real_step.py: python3 with torch, numpy).
# NexRL's comparator is not shipped: point NEXRL_COMPARE at your copy of
# nexrl/utils/compare_debug_dumps.py (github.com/nex-agi/NexRL; torch only) to include it.
#
# Environment: DUMPDIFF (default: the release build under $CARGO_TARGET_DIR or target/),
# RUNS (dumpdiff runs, default 10), NEXRL_RUNS (default 3), RESULTS (default
# benches/results), TAG (suffix of the JSON names, e.g. "before").
set -euo pipefail
cd "$(dirname "$0")/.."
TREE=${1:?usage: benches/hyperfine_step.sh TREE_DIR LABEL [gen_real_step.py options]}
LABEL=${2:?usage: benches/hyperfine_step.sh TREE_DIR LABEL [gen_real_step.py options]}
shift 2
command -v hyperfine > /dev/null || { echo "needs hyperfine (apt-get install hyperfine)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "needs GNU time at /usr/bin/time (apt-get install time)" >&2; exit 2; }
if [ -z "${DUMPDIFF:-}" ]; then
  cargo build -q --release --bin dumpdiff
  DUMPDIFF=${CARGO_TARGET_DIR:-target}/release/dumpdiff
fi
RUNS=${RUNS:-10}
NEXRL_RUNS=${NEXRL_RUNS:-3}
RESULTS=${RESULTS:-benches/results}
NAME=$LABEL${TAG:+-$TAG}
mkdir -p "$RESULTS"
[ -d "$TREE/self_hosted_pt" ] || python3 benches/gen_real_step.py "$TREE" "$@"
SH=$TREE/self_hosted_pt
WV=$TREE/weaver_pt
RANKS=$(find "$SH/forward_data" -name '*_micro0.pt' | wc -l)
MICROS=$(find "$SH/forward_data" -name 'step_000000_rank0_micro*.pt' | wc -l)
# Both trees are read before every run: the development VM pages out file pages idle for
# a second or two, so "page cache warm" holds only right after a read.
WARM="find $SH $WV -type f -exec cat {} + > /dev/null"
DD="$DUMPDIFF --self-hosted-dir $SH --weaver-dir $WV --step 0 --format json"
cmds=(-n "dumpdiff ($LABEL)" "$DD")
if [ -n "${NEXRL_COMPARE:-}" ]; then
  NX="python3 $NEXRL_COMPARE --self_hosted_dir $SH --weaver_dir $WV --step 0 --num_ranks $RANKS --num_micros $MICROS"
  hyperfine --style basic --prepare "$WARM" --runs "$NEXRL_RUNS" -n "NexRL compare_debug_dumps.py ($LABEL)" \
    --export-json "$RESULTS/$NAME-nexrl.json" "$NX"
fi
# dumpdiff exits 1 when it finds something (weaver's bf16 log-probs): -i.
hyperfine -i --style basic --prepare "$WARM" --runs "$RUNS" "${cmds[@]}" \
  --export-json "$RESULTS/$NAME-dumpdiff.json"
# Peak RSS: median of three runs.
peaks=()
for _ in 1 2 3; do
  bash -c "$WARM"
  /usr/bin/time -v -o "$RESULTS/.time" $DD > /dev/null 2>&1 || true
  peaks+=("$(awk -F': ' '/Maximum resident/ {print $2 / 1024}' "$RESULTS/.time")")
done
rm -f "$RESULTS/.time"
python3 - "$RESULTS/$NAME-dumpdiff.json" "${peaks[@]}" <<'EOF'
import json, statistics, sys
path, peaks = sys.argv[1], [float(p) for p in sys.argv[2:]]
d = json.load(open(path))
d["peak_rss_mb"] = peaks
json.dump(d, open(path, "w"), indent=2)
r = d["results"][0]
print(f"{r['command']}: {r['mean']:.3f} s ± {r['stddev']:.3f}, peak RSS {statistics.median(peaks):.0f} MB")
EOF
