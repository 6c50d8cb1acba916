"""logscan over many runs' logs on object storage, with Ray Data (docs/storage.md).

Runs sit one per prefix under a root (``s3://bucket/runs/<run>/steps.jsonl``, text logs,
tracker exports …). The pipeline:

1. ``ray.data.read_binary_files(include_paths=True)`` reads every file under the root as
   one row (path, bytes);
2. ``map_batches(place, batch_format="pyarrow")`` names each file's run (the first folder
   under the root) and its path inside the run;
3. ``groupby("run").map_groups(scan_run, batch_format="pyarrow")`` lays one run's files
   out on the worker's disk and runs ``rlforensics.logscan`` on the folder, its paths in
   the report rewritten to the run's URL;
4. the driver gathers {run: (report, exit code)}: for each run, the report ``logscan``
   gives on one machine for the run's folder (``python/tests/test_ray.py``).

A run is the unit of work: logscan's detectors read the whole per-step frame of a run.
pyarrow ignores ``AWS_ENDPOINT_URL``: pass the filesystem explicitly
(``ray_dumpdiff.filesystem_from_env``).

    python python/examples/ray_logscan.py s3://bucket/runs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

import rlforensics

try:  # run as a script beside ray_dumpdiff.py, or imported as examples.ray_logscan
    from ray_dumpdiff import _key, filesystem_from_env
except ImportError:  # pragma: no cover
    from .ray_dumpdiff import _key, filesystem_from_env


def place(batch: pa.Table, root: str) -> pa.Table:
    """Rows (path, bytes) → run, rel (the path inside the run), data. Files directly under
    the root (no run folder) are dropped."""
    runs, rels, datas = [], [], []
    for path, data in zip(batch.column("path").to_pylist(), batch.column("bytes").to_pylist()):
        rest = path[len(root) + 1 :] if path.startswith(root + "/") else None
        if not rest or "/" not in rest:
            continue
        run, rel = rest.split("/", 1)
        runs.append(run)
        rels.append(rel)
        datas.append(data)
    return pa.table(
        {
            "run": pa.array(runs, pa.string()),
            "rel": pa.array(rels, pa.string()),
            "data": pa.array(datas, pa.binary()),
        }
    )


def scan_run(group: pa.Table, root_url: str, flags: dict[str, Any]) -> pa.Table:
    """One run's files → its logscan report (JSON text, paths as the run's URL)."""
    (run,) = set(group.column("run").to_pylist())
    tmp = tempfile.mkdtemp(prefix="rlf-run-")
    try:
        folder = os.path.join(tmp, run)
        for rel, data in zip(group.column("rel").to_pylist(), group.column("data").to_pylist()):
            p = os.path.join(folder, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data)
        try:
            r = rlforensics.logscan(folder, frame=False, **flags)
            text, code = json.dumps(r.report, ensure_ascii=False), r.exit_code
        except rlforensics.RlforensicsError as e:
            text, code = json.dumps({"error": str(e)}, ensure_ascii=False), 2
        url = f"{root_url.rstrip('/')}/{run}"
        text = text.replace(json.dumps(folder)[1:-1], json.dumps(url)[1:-1])
        return pa.table({"run": [run], "exit_code": [code], "report": [text]})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(root_url: str, *, filesystem: pafs.FileSystem, **flags: Any) -> dict[str, tuple[dict, int]]:
    """Every run under ``root_url`` scanned on the current Ray cluster: {run: (report,
    exit code)}."""
    import ray

    root = _key(root_url)
    ds = ray.data.read_binary_files(root, include_paths=True, filesystem=filesystem)
    placed = ds.map_batches(place, batch_format="pyarrow", fn_kwargs={"root": root})
    rows = (
        placed.groupby("run")
        .map_groups(scan_run, batch_format="pyarrow", fn_kwargs={"root_url": root_url, "flags": flags})
        .take_all()
    )
    return {r["run"]: (json.loads(r["report"]), int(r["exit_code"])) for r in rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root", help="the prefix holding one folder per run")
    p.add_argument("--num-cpus", type=int, default=None)
    a = p.parse_args()
    import ray

    ray.init(num_cpus=a.num_cpus, include_dashboard=False)
    worst = 0
    for name, (report, code) in sorted(run(a.root, filesystem=filesystem_from_env()).items()):
        print(json.dumps({"run": name, "exit_code": code, "findings": len(report.get("findings", []))}))
        worst = max(worst, code)
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
