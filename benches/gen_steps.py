"""Write a DebugTrainer-style steps.jsonl of about SIZE_MB MiB for the logscan benches:
zero-loss runs of 10 steps every 50000 steps (with reward_std = 0), a NaN grad_norm every
100003 steps (bare NaN, as Python's json.dumps writes it). Usage: gen_steps.py PATH SIZE_MB"""
import json
import random
import sys

path, size = sys.argv[1], int(sys.argv[2]) << 20
random.seed(0)
with open(path, "w") as f:
    step, written = 0, 0
    while written < size:
        zero = 1000 <= step % 50000 < 1010
        rec = {"step": step, "train_loss": 0.0 if zero else random.uniform(0.01, 0.1),
               "step_loss": random.uniform(0.01, 0.1),
               "grad_norm": float("nan") if step % 100003 == 7 else random.uniform(0.1, 1.0),
               "grad_nan_count": 0, "param_norm": 101.5, "update_performed": True, "lr": 1e-5,
               "it_per_sec": 1.0, "tokens_per_sec": 900.0, "trained_tokens": step * 1000,
               "peak_memory_gb": 10.0, "timestamp": 1759944000.0 + step,
               "metrics": {"reward_mean": random.random(), "reward_std": 0.0 if zero else 0.3,
                           "kl": random.uniform(0, 0.01), "entropy": 1.0},
               "token_count_summary": {"min": 3, "max": 120, "mean": 60.5, "empty_count": 0}}
        line = json.dumps(rec) + "\n"   # bare NaN, like the trainer
        f.write(line)
        written += len(line)
        step += 1
