"""dumpdiff over a run's dump trees on object storage, with Ray Data (docs/storage.md).

The pipeline, one Ray Data stage per step:

1. ``ray.data.read_binary_files(include_paths=True)`` lists both trees (self-hosted and
   weaver) under their prefixes and reads each dump file as one row (path, bytes);
2. ``map_batches(normalise, batch_format="pyarrow")`` places each file with the wheel
   (``rlforensics.dump_coords``: side, kind, step, rank, micro — the same rules as
   ``dumpdiff``'s tree discovery) and drops what a tree would set aside;
3. ``write_parquet(partition_cols=["step", "kind"])`` keeps the placed files as Parquet
   partitioned by step and kind (on the same store, so every worker reads it);
4. ``groupby("step").map_groups(compare_step, batch_format="pyarrow")`` runs one
   ``rlforensics.dumpdiff`` per step on a worker: the step's files of both sides are laid
   out as two trees on the worker's disk and compared, the report's paths rewritten to the
   trees' URLs;
5. the driver gathers one report per step: the report ``dumpdiff --format json`` prints
   for that step on one machine, byte for byte (``python/tests/test_ray.py``).

Why the step is the unit of work and not the rank × micro cell: a cell's adjudication
reads the step's whole-batch files (trajectory, old log-probs), so a cell task would ship
them to every cell, and the step report's summary sections (verdict, worst cells, files
on one side only) are computed over all cells; one task per step keeps the report equal to
the single-machine one without a merge. Steps are the parallelism: 100 steps are 100 tasks.

pyarrow does not read ``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3``: pass the filesystem
explicitly (``filesystem_from_env`` builds one). The wheel's own reads (not used here:
the bytes arrive through Ray) would take ``s3://`` URLs and the ``AWS_*`` environment.

Run it (a local Ray with 2 CPUs and an S3 endpoint in ``AWS_ENDPOINT_URL``)::

    python python/examples/ray_dumpdiff.py s3://bucket/run/self_hosted s3://bucket/run/weaver \
        --step 0 --work s3://bucket/ray-work
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

import rlforensics

SIDES = ("self_hosted", "weaver")


def filesystem_from_env() -> pafs.S3FileSystem:
    """An S3 filesystem from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_REGION``
    and, when set, ``AWS_ENDPOINT_URL`` (``http://host:port`` → ``scheme="http"``), which
    pyarrow itself would ignore."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    kwargs: dict[str, Any] = dict(
        access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        region=os.environ.get("AWS_REGION", "us-east-1"),
    )
    if endpoint:
        u = urlparse(endpoint)
        kwargs.update(endpoint_override=u.netloc, scheme=u.scheme or "https")
    return pafs.S3FileSystem(**kwargs)


def _key(url: str) -> str:
    """``s3://bucket/run`` → ``bucket/run`` (pyarrow's paths have no scheme)."""
    u = urlparse(url)
    return (u.netloc + u.path).rstrip("/") if u.scheme else url.rstrip("/")


def normalise(batch: pa.Table, roots: dict[str, str]) -> pa.Table:
    """Rows (path, bytes) of read_binary_files → placed dump files: side, kind, step, rank,
    micro, name (the file name), data. Files dumpdiff would not place are dropped."""
    cols: dict[str, list] = {k: [] for k in ("side", "kind", "step", "rank", "micro", "name", "data")}
    for path, data in zip(batch.column("path").to_pylist(), batch.column("bytes").to_pylist()):
        side = next((s for s, r in roots.items() if path.startswith(r + "/")), None)
        coords = rlforensics.dump_coords(path)
        if side is None or coords is None:
            continue
        kind, step, rank, micro = coords
        for k, v in zip(cols, (side, kind, step, rank, micro, os.path.basename(path), data)):
            cols[k].append(v)
    return pa.table(
        {
            "side": pa.array(cols["side"], pa.string()),
            "kind": pa.array(cols["kind"], pa.string()),
            "step": pa.array(cols["step"], pa.int64()),
            "rank": pa.array(cols["rank"], pa.int64()),
            "micro": pa.array(cols["micro"], pa.int64()),
            "name": pa.array(cols["name"], pa.string()),
            "data": pa.array(cols["data"], pa.binary()),
        }
    )


def compare_step(group: pa.Table, urls: dict[str, str], flags: dict[str, Any]) -> pa.Table:
    """One step's files (both sides) → the step's dumpdiff report (JSON text, paths as the
    trees' URLs) and exit code."""
    steps = set(int(s) for s in group.column("step").to_pylist())
    (step,) = steps
    tmp = tempfile.mkdtemp(prefix=f"rlf-step{step}-")
    try:
        for side, kind, name, data in zip(
            group.column("side").to_pylist(),
            group.column("kind").to_pylist(),
            group.column("name").to_pylist(),
            group.column("data").to_pylist(),
        ):
            d = os.path.join(tmp, side, kind)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        dirs = {s: os.path.join(tmp, s) for s in SIDES}
        try:
            r = rlforensics.dumpdiff(dirs["self_hosted"], weaver_dir=dirs["weaver"], step=step, **flags)
            text, code = json.dumps(r.report, indent=2, ensure_ascii=False), r.exit_code
        except rlforensics.RlforensicsError as e:
            # What the command would print and exit 2 with (e.g. a step one side lacks).
            text, code = json.dumps({"error": str(e)}, ensure_ascii=False), 2
        for s in SIDES:
            text = text.replace(json.dumps(dirs[s])[1:-1], json.dumps(urls[s])[1:-1])
        return pa.table({"step": [step], "exit_code": [code], "report": [text]})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(
    self_hosted: str,
    weaver: str,
    *,
    work: str,
    filesystem: pafs.FileSystem,
    steps: list[int] | None = None,
    **flags: Any,
) -> dict[int, tuple[dict, int]]:
    """The whole pipeline on the current Ray cluster (``ray.init()`` first): per step, the
    report as Python objects and dumpdiff's exit code. ``work`` is where the partitioned
    Parquet goes (a URL on the same store, or a local folder on a one-machine cluster)."""
    import ray

    urls = {"self_hosted": self_hosted.rstrip("/"), "weaver": weaver.rstrip("/")}
    roots = {s: _key(u) for s, u in urls.items()}
    is_remote = urlparse(work).scheme != ""
    out = _key(work) + "/files"
    fs_out = filesystem if is_remote else None
    ds = ray.data.read_binary_files(list(roots.values()), include_paths=True, filesystem=filesystem)
    placed = ds.map_batches(normalise, batch_format="pyarrow", fn_kwargs={"roots": roots})
    if steps is not None:
        wanted = set(steps)
        placed = placed.filter(lambda row: row["step"] in wanted)
    placed.write_parquet(out, partition_cols=["step", "kind"], filesystem=fs_out)
    table = ray.data.read_parquet(out, filesystem=fs_out)
    reports = (
        table.groupby("step")
        .map_groups(
            compare_step,
            batch_format="pyarrow",
            fn_kwargs={"urls": urls, "flags": flags},
        )
        .take_all()
    )
    return {int(r["step"]): (json.loads(r["report"]), int(r["exit_code"])) for r in reports}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("self_hosted")
    p.add_argument("weaver")
    p.add_argument("--step", type=int, action="append", help="steps to compare (default: all)")
    p.add_argument("--work", required=True, help="where the partitioned Parquet goes")
    p.add_argument("--num-cpus", type=int, default=None)
    a = p.parse_args()
    import ray

    ray.init(num_cpus=a.num_cpus, include_dashboard=False)
    reports = run(a.self_hosted, a.weaver, work=a.work, filesystem=filesystem_from_env(), steps=a.step)
    worst = 0
    for step, (report, code) in sorted(reports.items()):
        print(json.dumps({"step": step, "exit_code": code, "verdict": report.get("verdict")}))
        worst = max(worst, code)
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
