#!/usr/bin/env bash
# Recall and precision of logscan over the shared corpus of real logs, against the truth
# file tests/data/real_logs_truth.json (the careful readings of the corpus READMEs).
#   recall    = MUST items found / MUST items (a finding of a listed detector, severe enough,
#               on overlapping steps; exit 2 where nothing can be read; frame checks)
#   precision = findings at warning or above that a MUST/SHOULD/NICE item supports
#               / all findings at warning or above (a TRAP that fires is a false alarm)
# Usage: scripts/corpus_score.sh [CORPUS_DIR]   (default ../shared/corpus; needs python3)
set -euo pipefail
cd "$(dirname "$0")/.."
corpus="${1:-${RLF_CORPUS_DIR:-../shared/corpus}}"
[ -d "$corpus" ] || { echo "no corpus at $corpus" >&2; exit 2; }
cargo build --quiet --locked --bin logscan
bin="${CARGO_TARGET_DIR:-target}/debug/logscan"
python3 - "$bin" "$corpus" tests/data/real_logs_truth.json <<'PY'
import json, subprocess, sys
binary, corpus, truth_path = sys.argv[1:4]
truth = json.load(open(truth_path))
RANK = {"info": 0, "warning": 1, "error": 2, "critical": 3}

def matches(f, item, min_sev=None):
    sev = min_sev or item.get("min_severity", "warning")
    if f["detector"] not in item["detectors"] or RANK[f["severity"]] < RANK[sev]:
        return False
    if "steps" in item:
        a, b = item["steps"]
        if f.get("first_step") is None or not (f["first_step"] <= b and a <= f["last_step"]):
            return False
    return True

must_total = must_found = 0
flagged = supported = traps_fired = 0
rows = []
for t in truth["files"]:
    path = f"{corpus}/{t['path']}"
    p = subprocess.run([binary, path, "--format", "json", "--fail-on", "critical"],
                       capture_output=True, text=True)
    musts = t.get("must", [])
    if t.get("exit") is not None:
        must_total += 1
        ok = p.returncode == t["exit"]
        must_found += ok
        rows.append((t["path"], f"exit {p.returncode} (want {t['exit']})", "ok" if ok else "MISSED"))
        continue
    if p.returncode == 2:
        must_total += len(musts) + 1
        rows.append((t["path"], "exit 2: " + p.stderr.strip()[:80], "MISSED"))
        continue
    r = json.loads(p.stdout)
    fs = r["findings"]
    found = 0
    frame_ok = all(r.get(k) == t[k] for k in ("first_step", "last_step") if k in t)
    if "runs" in t:
        frame_ok = frame_ok and r["files"][0].get("runs") == t["runs"]
    must_total += 1
    must_found += frame_ok
    for m in musts:
        must_total += 1
        if any(matches(f, m) for f in fs):
            found += 1
            must_found += 1
    wanted = musts + t.get("should", []) + t.get("nice", [])
    false = []
    for f in fs:
        if RANK[f["severity"]] < 1:
            continue
        flagged += 1
        if any(matches(f, w, "warning") for w in wanted):
            supported += 1
        else:
            false.append(f["detector"])
        if any(matches(f, tr, "warning") for tr in t.get("traps", [])):
            traps_fired += 1
    note = f"MUST {found}/{len(musts)}, frame {'ok' if frame_ok else 'WRONG'}"
    rows.append((t["path"], note, "false: " + ", ".join(false) if false else "ok"))
w = max(len(r[0]) for r in rows)
for a, b, c in rows:
    print(f"{a:<{w}}  {b:<28}  {c}")
recall = must_found / must_total if must_total else 1.0
precision = supported / flagged if flagged else 1.0
print(f"\nrecall    {must_found}/{must_total} = {recall:.1%} (MUST findings, exit codes and step/run checks)")
print(f"precision {supported}/{flagged} = {precision:.1%} (findings at warning or above that the readings support)")
print(f"traps fired at warning or above: {traps_fired}")
PY
