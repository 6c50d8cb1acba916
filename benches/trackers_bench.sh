#!/usr/bin/env bash
# logscan on large tracker files, side by side with the trackers' own Python readers.
#
#   benches/trackers_bench.sh                 # 1024 MB tfevents and .wandb, 64 MB for python
#   SIZE_MB=256 REF_MB=32 benches/trackers_bench.sh
#
# Needs python3 with tensorboard, tbparse, wandb and crc32c (pip) to write the inputs
# (benches/gen_trackers.py, into $DATA, default /tmp/rlf_trackers_bench) and to time
# tbparse (TensorBoard's EventAccumulator underneath) and wandb's protobuf classes.
# wandb 0.31 ships no Python reader of .wandb files (its Go core reads them), so the W&B
# baseline is its Record class with the LevelDB framing in Python, as the fixture
# generator reads them. Prints seconds and MB/s, best of REPEATS, page cache warm.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/bench-build}
SIZE_MB=${SIZE_MB:-1024}
REF_MB=${REF_MB:-64}
REPEATS=${REPEATS:-3}
DATA=${DATA:-/tmp/rlf_trackers_bench}
cargo build -q --release --bin logscan
BIN=$CARGO_TARGET_DIR/release/logscan

gen() { # kind size_mb -> dir
    local dir=$DATA/$1_$2
    [ -d "$dir" ] || python3 benches/gen_trackers.py "$1" "$dir" "$2" >/dev/null
    echo "$dir"
}
best() { # seconds of the fastest of REPEATS runs of "$@"
    local b=""
    for _ in $(seq "$REPEATS"); do
        local s e
        s=$(date +%s.%N)
        "$@" >/dev/null 2>&1 || true
        e=$(date +%s.%N)
        b=$(python3 -c "print(min(float('${b:-inf}'), $e - $s))")
    done
    echo "$b"
}
bytes() { find "$1" -type f \( -name 'events.out.tfevents.*' -o -name '*.wandb' \) -printf '%s\n' | awk '{s+=$1} END {print s}'; }
row() { # label dir seconds
    local mb
    mb=$(python3 -c "print($(bytes "$2") / 1048576)")
    python3 -c "print(f'{\"$1\":<44} {$mb:>8.0f} MB {$3:>8.2f} s {$mb / $3:>8.0f} MB/s')"
}

TB=$(gen tfevents "$SIZE_MB")
WB=$(gen wandb "$SIZE_MB")
TB_REF=$(gen tfevents "$REF_MB")
WB_REF=$(gen wandb "$REF_MB")
cat "$TB"/* "$WB"/wandb/*/* >/dev/null

row "logscan tfevents" "$TB" "$(best "$BIN" "$TB" --format json)"
row "logscan .wandb" "$WB" "$(best "$BIN" "$WB" --format json)"
row "logscan tfevents (python's input)" "$TB_REF" "$(best "$BIN" "$TB_REF" --format json)"
row "tbparse SummaryReader(...).scalars" "$TB_REF" \
    "$(best python3 -c "from tbparse import SummaryReader; SummaryReader('$TB_REF').scalars")"
row "logscan .wandb (python's input)" "$WB_REF" "$(best "$BIN" "$WB_REF" --format json)"
row "python: wandb Record + LevelDB framing" "$WB_REF" \
    "$(best python3 benches/gen_trackers.py read-wandb "$WB_REF" 0)"
