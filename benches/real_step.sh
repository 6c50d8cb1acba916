#!/usr/bin/env bash
# dumpdiff on one training step at a real step's size (NexRL layout: trajectories as token
# lists, bf16 entropy, nonzero entropy coefficient, weaver batch_inputs), side by side with
# NexRL's own comparator and with `cat` of the same files; and `dumpdiff --inspect` of the
# step's trajectory pickle. Wall time and peak RSS (`/usr/bin/time -v`) of each command,
# both the median of REPEATS runs (page cache warm); MB/s over the bytes of both trees.
#
#   benches/real_step.sh TREE_DIR [gen_real_step.py options]
#   benches/real_step.sh /tmp/rs12                                  # 12 x 2 x 64 x 4096
#   benches/real_step.sh /tmp/rs32 --ranks 32 --length 8192         # 32 x 2 x 64 x 8192
#
# TREE_DIR is generated when missing (python3 with torch and numpy; 600 MB for the first
# shape, 3.3 GB for the second). NexRL's comparator is not shipped: this script fetches
# nothing. Point NEXRL_COMPARE at your copy of `nexrl/utils/compare_debug_dumps.py` from
# https://github.com/nex-agi/NexRL (it needs torch only) to include it; it runs unchanged.
#
#   NEXRL_COMPARE=~/NexRL/nexrl/utils/compare_debug_dumps.py benches/real_step.sh /tmp/rs12
#
# Environment: REPEATS (default 3), DUMPDIFF (default: the release build in
# $CARGO_TARGET_DIR or target/, built when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
TREE=${1:?usage: benches/real_step.sh TREE_DIR [gen_real_step.py options]}
shift
REPEATS=${REPEATS:-3}
if [ -z "${DUMPDIFF:-}" ]; then
  cargo build -q --release --bin dumpdiff
  DUMPDIFF=${CARGO_TARGET_DIR:-target}/release/dumpdiff
fi
[ -x /usr/bin/time ] || { echo "needs GNU time at /usr/bin/time (apt-get install time)" >&2; exit 2; }
[ -d "$TREE/self_hosted_pt" ] || python3 benches/gen_real_step.py "$TREE" "$@"
SH=$TREE/self_hosted_pt
WV=$TREE/weaver_pt
TRAJ=$SH/trajectory/step_000000.pt
RANKS=$(find "$SH/forward_data" -name '*_micro0.pt' | wc -l)
MICROS=$(find "$SH/forward_data" -name 'step_000000_rank0_micro*.pt' | wc -l)
FILES=$(find "$SH" "$WV" -type f | sort)
BYTES=$(du -cb $FILES | tail -1 | cut -f1)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# "<median wall seconds> <median peak RSS MB> <median CPU seconds (user + sys)>" of
# REPEATS runs of "$@" (stdout discarded; dumpdiff exits 1 on findings). On a shared
# machine the CPU time is the steadier figure: wall time counts other processes' turns.
# Both trees are read (`cat`, untimed) before every run: the development VM's kernel
# pages out file pages idle for a second or two (DAMON reclaim), so "page cache warm"
# holds only right after a read.
measure() {
  local walls=() peaks=() cpus=()
  for _ in $(seq "$REPEATS"); do
    local s e
    cat $FILES > /dev/null
    s=$(date +%s.%N)
    /usr/bin/time -v -o "$OUT/time" "$@" > /dev/null 2>&1 || true
    e=$(date +%s.%N)
    walls+=("$(python3 -c "print($e - $s)")")
    peaks+=("$(awk -F': ' '/Maximum resident/ {print $2 / 1024}' "$OUT/time")")
    cpus+=("$(awk -F': ' '/User time|System time/ {s += $2} END {print s}' "$OUT/time")")
  done
  python3 -c "
import statistics, sys
w, p, c = (a.split() for a in sys.argv[1:4])
m = lambda xs: statistics.median(map(float, xs))
print(f'{m(w):.3f} {m(p):.0f} {m(c):.3f}')" "${walls[*]}" "${peaks[*]}" "${cpus[*]}"
}
row() { printf '%-44s %9s s %10s MB/s %8s MB  cpu %7s s\n' "$1" "$2" "$3" "$4" "$5"; }
mbs() { python3 -c "print(f'{$1 / 1e6 / $2:.0f}')"; }

cat $FILES > /dev/null   # page cache warm for everyone
DD=("$DUMPDIFF" --self-hosted-dir "$SH" --weaver-dir "$WV" --step 0 --format json)
echo "tree: $TREE ($RANKS ranks x $MICROS micros), $(python3 -c "print(f'{$BYTES / 1e6:.0f}')") MB in $(echo "$FILES" | wc -l) files; median of $REPEATS"
read -r t p c < <(measure "${DD[@]}"); row "dumpdiff (self-hosted vs weaver)" "$t" "$(mbs "$BYTES" "$t")" "$p" "$c"
DD_T=$t DD_C=$c
read -r t p c < <(measure cat $FILES); row "cat of every file of both trees" "$t" "$(mbs "$BYTES" "$t")" "$p" "$c"
CAT_T=$t CAT_C=$c
if [ -n "${NEXRL_COMPARE:-}" ]; then
  NX=(python3 "$NEXRL_COMPARE" --self_hosted_dir "$SH" --weaver_dir "$WV" --step 0
      --num_ranks "$RANKS" --num_micros "$MICROS")
  "${NX[@]}" > /dev/null 2>&1 || { echo "NexRL comparator failed: ${NX[*]}" >&2; exit 1; }
  read -r t p c < <(measure "${NX[@]}"); row "NexRL compare_debug_dumps.py (unchanged)" "$t" "$(mbs "$BYTES" "$t")" "$p" "$c"
  python3 -c "print(f'dumpdiff is {$t / $DD_T:.1f}x faster than NexRL comparator (wall), {$c / $DD_C:.1f}x less CPU')"
else
  echo "(NexRL comparator skipped: set NEXRL_COMPARE to compare_debug_dumps.py from github.com/nex-agi/NexRL)"
fi
python3 -c "print(f'dumpdiff / cat: {$DD_T / $CAT_T:.1f}x (wall), {$DD_C / max($CAT_C, 0.01):.1f}x (cpu)')"
# The same ratio from runs taken in turns (dumpdiff, then cat, REPEATS rounds), so that
# both see the same state of the machine: `cat` alone moves by 1.5x between minutes here.
ratios=()
for _ in $(seq "$REPEATS"); do
  cat $FILES > /dev/null
  s=$(date +%s.%N); "${DD[@]}" > /dev/null 2>&1 || true; e=$(date +%s.%N)
  cat $FILES > /dev/null
  s2=$(date +%s.%N); cat $FILES > /dev/null; e2=$(date +%s.%N)
  ratios+=("$(python3 -c "print(($e - $s) / ($e2 - $s2))")")
done
python3 -c "
import statistics, sys
r = sorted(map(float, sys.argv[1:]))
print(f'dumpdiff / cat, runs in turns: median {statistics.median(r):.1f}x (range {r[0]:.1f}-{r[-1]:.1f}x, {len(r)} rounds)')" "${ratios[@]}"
TB=$(stat -c %s "$TRAJ")
IN=("$DUMPDIFF" --inspect "$TRAJ")
read -r t p c < <(measure "${IN[@]}")
row "dumpdiff --inspect trajectory ($(python3 -c "print(f'{$TB / 1e6:.1f}')") MB)" "$t" "$(mbs "$TB" "$t")" "$p" "$c"
python3 -c "print(f'--inspect peak / file size: {$p * 1048576 / $TB:.2f}x')"
