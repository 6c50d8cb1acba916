#!/usr/bin/env python3
"""The formulas of benches/kernels_bench.rs in PyTorch CPU (torch.set_num_threads(2)):
nexrl-is, trl-grpo and verl-vanilla loss + the same metrics (+ gradient w.r.t. log_probs)
on the same 256 x 8192 inputs (same splitmix64 stream), f64 and f32.

Usage: python3 benches/kernels_torch.py [REPEATS] [ROWS] [COLS] [FILTER...] (filter words such
as trl-grpo, f32, fwd, grad keep the cases matching all of them)
Output: one line per case, `torch preset=P precision=F mode=M ms=X loss=L`.
"""
import sys
import time

import numpy as np
import torch

torch.set_num_threads(2)
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix(seed, n):
    """The first n outputs of splitmix64(seed) as uniforms in [0, 1) (as the Rust bench)."""
    with np.errstate(over="ignore"):
        k = np.arange(1, n + 1, dtype=np.uint64)
        z = np.uint64(seed) + k * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def inputs(b, t):
    u = splitmix(20250607, 2 * b * t + b)
    old = -3.0 * u[0:2 * b * t:2] - 1e-3
    new = old + 0.4 * (u[1:2 * b * t:2] - 0.5)
    adv = 2.0 * u[2 * b * t:] - 1.0
    mask = np.zeros((b, t))
    for i in range(b):
        mask[i, : t // 4 + (i * 7919) % (3 * t // 4)] = 1.0
    f = torch.from_numpy
    return f(new.reshape(b, t)), f(old.reshape(b, t)), f(adv), f(mask)


def mm_trl(x, m):
    return (x * m).sum() / m.sum().clamp(min=1.0)


def mm_verl(x, m):
    return (x * m).sum() / (m.sum() + 1e-8)


def nexrl_metrics(lr, ratio, m):
    return [mm_trl(0.5 * lr * lr, m), mm_trl(ratio, m),
            mm_trl(((ratio - 1.0).abs() > 0.2).to(ratio.dtype), m)]


def nexrl_is(lp, old, a, m):
    lr = lp - old
    ratio = lr.exp()
    per = -ratio * a
    loss = (per * m).sum() / m.sum()
    return loss, [mm_verl(-lr, m)] + nexrl_metrics(lr, ratio, m)


def trl_grpo(lp, old, a, m, eps=0.2):
    lr = lp - old
    c1 = lr.exp()
    c2 = c1.clamp(1 - eps, 1 + eps)
    per = -torch.min(c1 * a, c2 * a)
    loss = ((per * m).sum(1) / m.sum(1).clamp(min=1.0)).mean()
    dt = lp.dtype
    low = ((c1 < 1 - eps) & (a < 0)).to(dt)
    high = ((c1 > 1 + eps) & (a > 0)).to(dt)
    pg2 = -a * c2
    frac = mm_verl((pg2 > -a * c1).to(dt), m)
    return loss, [mm_trl(low, m), mm_trl(high, m), mm_trl(torch.max(low, high), m), frac,
                  mm_verl(-lr, m)] + nexrl_metrics(lr, c1, m)


def verl_vanilla(lp, old, a, m, eps=0.2, c=3.0):
    raw = lp - old
    lr = raw.clamp(-20.0, 20.0)
    ratio = lr.exp()
    pg1 = -a * ratio
    pg2 = -a * ratio.clamp(1 - eps, 1 + eps)
    clip1 = torch.max(pg1, pg2)
    pg3 = -a * c
    clip2 = torch.min(pg3, clip1)
    per = torch.where(a < 0, clip2, clip1)
    loss = (per * m).sum() / m.sum()
    dt = lp.dtype
    low = ((ratio < 1 - eps) & (a < 0)).to(dt)
    high = ((ratio > 1 + eps) & (a > 0)).to(dt)
    return loss, [mm_trl(low, m), mm_trl(high, m), mm_trl(torch.max(low, high), m),
                  mm_verl((pg2 > pg1).to(dt), m),
                  mm_verl(((clip1 > pg3) & (a < 0)).to(dt), m),
                  mm_verl(-lr, m)] + nexrl_metrics(raw, ratio, m)


def main():
    argv = [int(x) for x in sys.argv[1:] if x.isdigit()]
    only = [x for x in sys.argv[1:] if not x.isdigit()]
    repeats = max(argv[0] if argv else 5, 1)
    b = argv[1] if len(argv) > 1 else 256
    t = argv[2] if len(argv) > 2 else 8192
    new, old, adv, mask = inputs(b, t)
    for name, fn in [("nexrl-is", nexrl_is), ("trl-grpo", trl_grpo), ("verl-vanilla", verl_vanilla)]:
        for prec, dt in [("f64", torch.float64), ("f32", torch.float32)]:
            lp0, o, m = new.to(dt), old.to(dt), mask.to(dt)
            a = adv.to(dt).view(-1, 1).expand(b, t)
            for mode in ["loss+metrics", "loss+metrics+grad"]:
                case = f"{name} {prec} {'grad' if mode.endswith('grad') else 'fwd'}"
                if not all(w in case for w in only):
                    continue
                best, loss = float("inf"), float("nan")
                for _ in range(repeats):
                    lp = lp0.clone().requires_grad_(mode.endswith("grad"))
                    t0 = time.perf_counter()
                    if mode.endswith("grad"):
                        out, mets = fn(lp, o, a, m)
                        out.backward()
                        g = lp.grad
                    else:
                        with torch.no_grad():
                            out, mets = fn(lp, o, a, m)
                    vals = [float(x.detach()) for x in mets]  # metrics materialised, as in Rust
                    ms = (time.perf_counter() - t0) * 1e3
                    best, loss = min(best, ms), float(out)
                print(f"torch preset={name} precision={prec} mode={mode} ms={best:.2f} loss={loss:.9f}")


if __name__ == "__main__":
    main()
