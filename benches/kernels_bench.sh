#!/usr/bin/env bash
# Loss-kernel speed, side by side: our kernels (benches/kernels_bench.rs: the fused path,
# gradient included) vs the same formulas in PyTorch CPU with 2 threads
# (benches/kernels_torch.py), 256 x 8192 tokens. Prints both and the ratio ours/torch
# (< 1: we are faster), plus both losses. Both processes run with the same glibc malloc
# settings: both get the same two thresholds through glibc's environment variables (torch
# reuses its freed intermediates either way; without them each of our calls would fault in
# fresh zeroed pages for its output tensors).
# Needs python3 with torch and numpy.
# Usage: benches/kernels_bench.sh [REPEATS] [ROWS] [COLS] [FILTER...]
# (filter words such as trl-grpo, f32, fwd, grad keep the cases matching all of them)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/bench-build}
args=("${1:-5}" "${2:-256}" "${3:-8192}" "${@:4}")
cargo bench -q --bench kernels_bench --no-run >/dev/null 2>&1 || cargo bench --bench kernels_bench --no-run
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824
ours=$(cargo bench -q --bench kernels_bench -- "${args[@]}")
theirs=$(python3 benches/kernels_torch.py "${args[@]}")
echo "$ours"
echo "$theirs"
printf '\n%-13s %-4s %-18s %10s %10s %7s  %s\n' preset prec mode ours_ms torch_ms ratio "loss ours / torch"
join -j1 <(echo "$ours" | awk '{print $2"|"$3"|"$4, $5, $6}' | sort) \
         <(echo "$theirs" | awk '{print $2"|"$3"|"$4, $5, $6}' | sort) |
  awk '{split($1,k,"|"); sub("preset=","",k[1]); sub("precision=","",k[2]); sub("mode=","",k[3]);
        a=$2; sub("ms=","",a); b=$4; sub("ms=","",b); la=$3; sub("loss=","",la); lb=$5; sub("loss=","",lb);
        printf "%-13s %-4s %-18s %10.2f %10.2f %7.2f  %s / %s\n", k[1], k[2], k[3], a, b, a/b, la, lb}'
