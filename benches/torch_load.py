"""Baseline for benches/read_tree.rs: torch.load every file of a dump tree, then convert
every tensor to float64 — what a python comparator does before it can compare anything."""
import sys
import time
from pathlib import Path

import torch


def tensors(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, dict):
        for x in v.values():
            yield from tensors(x)
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from tensors(x)


def main():
    root = Path(sys.argv[1])
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    files = sorted(p for p in root.glob("*/*.pt"))
    mb = sum(p.stat().st_size for p in files) / 1e6
    torch.set_num_threads(2)
    best_load = best_dec = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        loaded = [torch.load(p, weights_only=True) for p in files]
        best_load = min(best_load, time.perf_counter() - t)
        t = time.perf_counter()
        for p in files:
            for x in tensors(torch.load(p, weights_only=True)):
                x.to(torch.float64)
        best_dec = min(best_dec, time.perf_counter() - t)
        del loaded
    print(f"torch files={len(files)} MB={mb:.2f} load_s={best_load:.4f} "
          f"load_MBps={mb / best_load:.0f} decode_s={best_dec:.4f} decode_MBps={mb / best_dec:.0f}")


if __name__ == "__main__":
    main()
