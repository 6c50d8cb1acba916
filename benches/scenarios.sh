#!/usr/bin/env bash
# N seeded scenarios (fixtures/gen/make_scenarios.py), each checked with the debug dumpdiff
# and losscheck (JSON), scored against its truth.json by benches/score_scenarios.py: per seed
# the false alarms and misses of each tool, then the totals.
#
#   benches/scenarios.sh 50          # seeds 0..49
#   benches/scenarios.sh 20 100      # seeds 100..119
#   KEEP=/tmp/scen benches/scenarios.sh 50   # keep the scenarios and reports in /tmp/scen
#   BIN=target/release benches/scenarios.sh 50   # other binaries (default: $CARGO_TARGET_DIR/debug)
#   SHAPE=large benches/scenarios.sh 200 6000    # steps of 64-512 tokens, 4-16 rows per micro
#   FAMILY=real benches/scenarios.sh 40          # the real-producer family (make_real_scenarios.py)
#   FAMILY=real GEN_ARGS='--easy --set pad_id=151643' benches/scenarios.sh 5   # one convention alone
#   FAMILY=real GEN_ARGS=--novel benches/scenarios.sh 40 5000   # conventions the family never drew
#
# Exit status: the scorer's (0 when every count is zero). Needs python3 with torch and numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:?usage: benches/scenarios.sh N [FIRST_SEED]}
FIRST=${2:-0}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/debug}
[ -x "$BIN/dumpdiff" ] && [ -x "$BIN/losscheck" ] || cargo build -q --locked --bins
BIN=$(realpath "$BIN")
if [ -n "${KEEP:-}" ]; then
  WORK=$KEEP
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
fi
REPO=$PWD
# one python process writes every scenario, then reads each back and checks its truth
if [ "${FAMILY:-}" = real ]; then
  # shellcheck disable=SC2086  # GEN_ARGS is a list of words
  python3 fixtures/gen/make_real_scenarios.py --range "$FIRST" "$N" --out "$WORK" --verify ${GEN_ARGS:-}
else
  python3 fixtures/gen/make_scenarios.py --range "$FIRST" "$N" --out "$WORK" --verify --shape "${SHAPE:-ci}"
fi
dirs=()
for ((seed = FIRST; seed < FIRST + N; seed++)); do
  if [ "${FAMILY:-}" = real ]; then
    d=$WORK/real-seed-$seed
  else
    d=$WORK/seed-$(printf %03d "$seed")
  fi
  mkdir -p "$d/out"
  remote=()
  [ -d "$d/remote_api_pt" ] && remote=(--remote-api-dir remote_api_pt)
  # the tools exit 1 on findings: record every exit code, never stop on it
  cd "$d"
  rc=0
  "$BIN/dumpdiff" --self-hosted-dir self_hosted_pt --weaver-dir weaver_pt "${remote[@]}" --step 0 \
    --format json >out/dumpdiff.json 2>out/dumpdiff.err || rc=$?
  echo $rc >out/dumpdiff.rc
  for tree in self_hosted_pt weaver_pt; do
    rc=0
    "$BIN/losscheck" --dump-dir "$tree" --step 0 --format json >"out/losscheck_$tree.json" \
      2>"out/losscheck_$tree.err" || rc=$?
    echo $rc >"out/losscheck_$tree.rc"
  done
  cd "$REPO"
  dirs+=("$d")
done
python3 benches/score_scenarios.py "${dirs[@]}" --json "$WORK/score.json"
