#!/usr/bin/env bash
# Side-by-side: the python+torch baseline vs dumpdiff on the generated large tree.
# usage: benches/dumpdiff_compare.sh [LARGE_DIR] [DUMPDIFF_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/tmp/dd_large}
BIN=${2:-target/release/dumpdiff}
[ -d "$DIR/self_hosted_pt" ] || python3 fixtures/gen/make_dumps.py --large "$DIR"
BYTES=$(du -cb "$DIR"/self_hosted_pt/{forward_data,loss,old_log_probs} "$DIR"/weaver_pt/{forward_data,loss,is_loss_debug} | tail -1 | cut -f1)
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
set +e
RS=$(best "$BIN" --self-hosted-dir "$DIR/self_hosted_pt" --weaver-dir "$DIR/weaver_pt" --step 0 --format json)
set -e
python3 - "$PY" "$RS" "$BYTES" <<'PYEOF'
import sys
py, rs, b = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
print(f"bytes compared: {b/1e6:.1f} MB")
print(f"python+torch baseline: {py:.3f} s  ({b/1e6/py:.0f} MB/s)")
print(f"dumpdiff:              {rs:.3f} s  ({b/1e6/rs:.0f} MB/s)")
print(f"ratio (baseline / dumpdiff): {py/rs:.2f}x")
PYEOF
