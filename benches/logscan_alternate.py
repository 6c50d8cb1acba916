#!/usr/bin/env python3
"""Alternating before/after runs of logscan (every detector, `--fail-on critical
--no-color`) on the large inputs, for a machine shared with other work: each round runs
every binary on each input, the order of the binaries reversed every other round; wall
time (perf_counter), CPU user/system (RUSAGE_CHILDREN) and the 1-minute load average
before each run. Writes the JSON of benches/results/logscan_1024mb-session20-*.json.

    python3 benches/logscan_alternate.py OUT.json ROUNDS NOTE \
        before=path/to/logscan:"release build of X" after=path/to/logscan:"... of Y" \
        -- wandb=DIR/run-bench.wandb tfevents=DIR/events.out.tfevents...
"""
import json, os, resource, subprocess, sys, time, statistics
out, rounds, note = sys.argv[1], int(sys.argv[2]), sys.argv[3]
args = sys.argv[4:]
k = args.index("--")
bins = [a.split("=", 1) for a in args[:k]]
inputs = [a.split("=", 1) for a in args[k + 1:]]
res = {}
for r in range(rounds):
    order = bins if r % 2 == 0 else bins[::-1]
    for iname, ipath in inputs:
        for bname, bspec in order:
            bpath = bspec.split(":", 1)[0]
            load = os.getloadavg()[0]
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            p = subprocess.run([bpath, ipath, "--fail-on", "critical", "--no-color"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            t = time.perf_counter() - t0
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            e = res.setdefault((bname, iname), dict(times=[], users=[], systems=[], load=[], exit_codes=[]))
            e["times"].append(t); e["users"].append(ru1.ru_utime - ru0.ru_utime)
            e["systems"].append(ru1.ru_stime - ru0.ru_stime); e["load"].append(load)
            e["exit_codes"].append(p.returncode)
            print(f"{r} {iname} {bname} {t:.3f} {ru1.ru_utime-ru0.ru_utime:.2f} {ru1.ru_stime-ru0.ru_stime:.2f} load {load:.2f}", flush=True)
def input_bytes(path):
    """A file's size, or the sizes of every file under a directory (an MLflow run)."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


results = []
for (bname, iname), e in res.items():
    spec = dict(bins)[bname]
    label = spec.split(":", 1)[1] if ":" in spec else spec
    size = input_bytes(dict(inputs)[iname]) / 1048576
    t = e["times"]
    results.append(dict(command=f"{bname}: logscan {os.path.basename(dict(inputs)[iname])} --fail-on critical --no-color",
        binary=label, **e, mean=statistics.mean(t), stddev=statistics.stdev(t) if len(t) > 1 else 0.0,
        median=statistics.median(t), min=min(t), max=max(t), user=statistics.mean(e["users"]),
        system=statistics.mean(e["systems"]), mib_per_s=size / statistics.mean(t),
        input_mib=size, note=note))
json.dump(dict(results=results), open(out, "w"), indent=1)
for x in results:
    print(f'{x["command"][:60]:60s} mean {x["mean"]:.3f} ± {x["stddev"]:.3f} min {x["min"]:.3f} cpu {x["user"]:.2f}+{x["system"]:.2f}={x["user"]+x["system"]:.2f} MiB/s {x["mib_per_s"]:.0f} load {min(x["load"]):.1f}-{max(x["load"]):.1f}')
