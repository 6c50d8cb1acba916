#!/usr/bin/env bash
# Reading speed, side by side: our .pt reader vs torch.load on the same files, and the
# page-cache limit (cat). Needs python3 with torch (pip install torch numpy).
# Usage: benches/read_bench.sh [DIR]   (DIR defaults to bench-data/, generated on demand)
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-bench-data}
if [ ! -d "$data/self_hosted_pt" ]; then
  python3 fixtures/gen/make_dumps.py --large "$data"
fi
cargo build --release --benches --bin dumpdiff >/dev/null 2>&1 || cargo build --release --benches --bin dumpdiff
for tree in fixtures/dumps/self_hosted_pt fixtures/dumps/weaver_pt "$data/self_hosted_pt" "$data/weaver_pt"; do
  echo "== $tree"
  files=$(find "$tree" -name '*.pt' | sort)
  cat $files > /dev/null   # warm the page cache
  mb=$(du -cb $files | tail -1 | awk '{print $1/1e6}')
  t0=$(date +%s.%N); cat $files > /dev/null; t1=$(date +%s.%N)
  awk -v mb="$mb" -v a="$t0" -v b="$t1" 'BEGIN{printf "cat      MB=%.2f s=%.4f MBps=%.0f\n", mb, b-a, mb/(b-a)}'
  cargo bench -q --bench read_tree -- "$tree" 5
  python3 benches/torch_load.py "$tree" 5
done
