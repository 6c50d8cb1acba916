#!/usr/bin/env bash
# Side-by-side: the python+torch baseline vs dumpdiff on the generated large tree.
# usage: benches/dumpdiff_compare.sh [LARGE_DIR] [DUMPDIFF_BINARY]
# Prints best-of-3 wall times (the baseline's as a process, and its own in-process time
# without interpreter start and `import torch`), our peak RSS, and `cat` of the same files.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/tmp/dd_large}
BIN=${2:-target/release/dumpdiff}
[ -d "$DIR/self_hosted_pt" ] || python3 fixtures/gen/make_dumps.py --large "$DIR"
FILES=("$DIR"/self_hosted_pt/{forward_data,loss,old_log_probs} "$DIR"/weaver_pt/{forward_data,loss,is_loss_debug})
BYTES=$(du -cb "${FILES[@]}" | tail -1 | cut -f1)
best() { # best of 3 wall-clock seconds of "$@"
  local b=999999
  for _ in 1 2 3; do
    local s e; s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N)
    b=$(python3 -c "print(min($b, $e - $s))")
  done
  echo "$b"
}
# page cache warm for both
cat "$DIR"/self_hosted_pt/*/* "$DIR"/weaver_pt/*/* > /dev/null
PY=$(best python3 benches/dumpdiff_baseline.py "$DIR/self_hosted_pt" "$DIR/weaver_pt" 0)
PY_IN=999999
for _ in 1 2 3; do
  s=$(python3 benches/dumpdiff_baseline.py "$DIR/self_hosted_pt" "$DIR/weaver_pt" 0 |
      python3 -c "import json, sys; print(json.load(sys.stdin)['seconds'])")
  PY_IN=$(python3 -c "print(min($PY_IN, $s))")
done
ARGS=(--self-hosted-dir "$DIR/self_hosted_pt" --weaver-dir "$DIR/weaver_pt" --step 0 --format json)
set +e
RS=$(best "$BIN" "${ARGS[@]}")
PEAK=$( { /usr/bin/time -f %M "$BIN" "${ARGS[@]}" >/dev/null; } 2>&1 | tail -1)
set -e
CAT=$(best cat $(find "${FILES[@]}" -type f))
python3 - "$PY" "$PY_IN" "$RS" "$BYTES" "$PEAK" "$CAT" <<'PYEOF'
import sys
py, py_in, rs, b = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
peak, cat = int(sys.argv[5]), float(sys.argv[6])
print(f"bytes compared: {b/1e6:.1f} MB")
print(f"python+torch baseline: {py:.3f} s  ({b/1e6/py:.0f} MB/s), in-process {py_in:.3f} s")
print(f"dumpdiff:              {rs:.3f} s  ({b/1e6/rs:.0f} MB/s), peak RSS {peak/1024:.0f} MB")
print(f"cat of the same files: {cat:.3f} s")
print(f"ratio (baseline / dumpdiff): {py/rs:.2f}x (in-process baseline: {py_in/rs:.2f}x)")
PYEOF
