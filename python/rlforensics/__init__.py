"""rlforensics from Python: the dump and log frames as polars DataFrames, and the commands
(dumpdiff, logscan, losscheck, mismatch) returning their JSON report as Python objects.

The compiled library reads the files (the GIL released), builds polars-rs frames and
hands them over as Arrow C streams (the Arrow PyCapsule interface): polars imports the
buffers without copying them. Any polars from 1.3 on works; nothing pins its version.

>>> import rlforensics as rf
>>> frames = rf.read_dump("fixtures/dumps/self_hosted_pt", step=0)
>>> sorted(frames)
['scalars', 'tokens', 'trajectories']
>>> frames["trajectories"].columns[:4]
['kind', 'step', 'index', 'tokens_hash']
>>> logs = rf.read_logs("fixtures/logs/debug_faults/steps.jsonl")
>>> logs.columns[:3]
['step', 'timestamp', 'source']
>>> r = rf.dumpdiff("fixtures/dumps/self_hosted_pt", weaver_dir="fixtures/dumps/weaver_faulty_pt", step=0)
>>> r.exit_code, r.report["verdict"]
(1, 'fail')
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Union

import polars as pl

from . import _native
from ._native import RlforensicsError

__all__ = [
    "RlforensicsError",
    "ToolResult",
    "read_dump",
    "read_logs",
    "read_events",
    "dumpdiff",
    "losscheck",
    "logscan",
    "mismatch",
    "fetch_stats",
    "dump_coords",
    "__version__",
]

__version__: str = _native.__version__

PathLike = Union[str, "os.PathLike[str]"]


def fetch_stats() -> dict[str, int]:
    """Bytes of object data and requests this process has fetched from object storage
    (``s3://``, ``gs://``, ``az://``, ``http(s)://`` paths, which every reader and command
    here accepts; credentials and endpoint from ``AWS_*`` / ``AWS_ENDPOINT_URL``). The
    counters only grow: take the difference around a call.

    >>> sorted(fetch_stats())
    ['bytes', 'requests']
    """
    return dict(_native.fetch_stats())


def dump_coords(path: PathLike) -> tuple[str, int, int | None, int | None] | None:
    """(kind, step, rank, micro) of a dump file from its path alone, as ``dumpdiff`` places
    it in a tree; ``None`` for a file it sets aside. For pipelines that see one file at a
    time (``python/examples/ray_dumpdiff.py``).

    >>> dump_coords("s3://b/run/forward_data/step_000003_rank1_micro0.pt")
    ('forward_data', 3, 1, 0)
    >>> dump_coords("run/notes.txt") is None
    True
    """
    return _native.dump_coords(os.fspath(path))


def _frame(stream: Any) -> pl.DataFrame:
    """A polars DataFrame over an Arrow C stream (no copy of the buffers)."""
    return pl.DataFrame(stream)


def _paths(paths: PathLike | Iterable[PathLike]) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    return [os.fspath(p) for p in paths]


def read_dump(path: PathLike, step: int | None = None) -> dict[str, pl.DataFrame]:
    """The normalised tables of a dump folder (or of one dump file inside a kind folder):

    - ``scalars``: one row per number of a file (kind, step, rank, micro, key, value);
    - ``tokens``: one row per (file, row, pos), one Float64 column per per-token tensor
      (``log_probs``, ``entropy``, ``response_mask``, ``old_log_probs``, …);
    - ``trajectories``: one row per trajectory or datum (index, tokens_hash, length, reward,
      loss_mask_sum, advantage, is_val, group_id, uid, run_id, task_id; for another
      stack's dump: index, length, reward, advantage, group_id, uid, and the decoded
      ``prompt`` / ``response`` where the stack dumps text).

    The same frames ``dumpdiff --inspect PATH --export-frames DIR`` writes as Parquet.
    ``step`` keeps one step (every step when ``None``). Raises :class:`RlforensicsError`
    (file and position in the message) on a missing or corrupt input.

    >>> t = read_dump("fixtures/dumps/self_hosted_pt", step=0)["tokens"]
    >>> t.columns[:6]
    ['kind', 'step', 'rank', 'micro', 'row', 'pos']
    """
    native = _native.read_dump(os.fspath(path), step)
    return {name: _frame(stream) for name, stream in native.items()}


def read_logs(
    paths: PathLike | Iterable[PathLike],
    *,
    raw: bool = False,
    aliases: PathLike | None = None,
    run: str | None = None,
) -> pl.DataFrame:
    """The per-step frame logscan judges: ``step``, ``timestamp``, ``source``, then one
    Float64 column per canonical metric (``loss``, ``grad_norm``, ``reward_mean``, …) found
    in the logs (files or run folders; every format logscan reads: steps.jsonl, verl,
    HF trainer_state.json, text logs, TensorBoard, W&B, MLflow, Trackio, CSV).

    A path may be a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``): the objects a log
    reader reads under it are fetched into a private temporary folder and read from there
    (docs/storage.md); errors name the URL.

    ``raw=True`` adds every raw key as ``raw:<key>``; ``aliases`` is a JSON alias file
    (``{"canonical": ["raw key", …]}``) tried before the built-in table; ``run`` picks one
    run of an input holding several. Raises :class:`RlforensicsError` when nothing could
    be read, as ``logscan`` exits 2.

    >>> df = read_logs("fixtures/logs/debug_faults/steps.jsonl")
    >>> df.height > 0 and "loss" in df.columns
    True
    """
    return _frame(
        _native.read_logs(
            _paths(paths), raw, None if aliases is None else os.fspath(aliases), run
        )
    )


def read_events(
    paths: PathLike | Iterable[PathLike],
    *,
    aliases: PathLike | None = None,
    run: str | None = None,
) -> pl.DataFrame:
    """The events of the logs (``events.jsonl`` lines: NaN gradients, empty completions,
    checkpoints, …), one row each: ``kind``, ``step``, ``reported_step``,
    ``step_inferred``, ``timestamp``, ``level``, ``file``, ``line``, ``run``, ``text``,
    ``source_format``, then one column per payload number (Float64) or list
    (List(Float64)), null where an event does not carry it. Paths may be URLs, as for
    :func:`read_logs`; ``file`` then names the object's URL.

    >>> ev = read_events("fixtures/logs/debug_faults")
    >>> "kind" in ev.columns
    True
    """
    return _frame(
        _native.read_events(
            _paths(paths), None if aliases is None else os.fspath(aliases), run
        )
    )


@dataclass
class ToolResult:
    """What a command returns from Python.

    ``report``: the JSON report (``--format json``) as Python objects;
    ``exit_code``: the command's exit code (0 clean, 1 found; a bad input raises instead
    of returning 2); ``tables``: every list of records in the report as a polars frame
    (dumpdiff: ``sections``, ``coverage``, ``worst``, ``offending_files`` …; logscan:
    ``findings``, ``files``, and ``frame``, the log frame the detectors read).
    """

    report: Any
    exit_code: int
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)


def _argv(flags: dict[str, Any]) -> list[str]:
    """Keyword arguments as command-line flags: ``fail_on="warning"`` → ``--fail-on
    warning``, ``True`` → the bare flag, ``False``/``None`` → nothing, a list → the flag
    repeated, a dict → ``--flag KEY=VALUE`` per item."""
    out: list[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, dict):
            for k, v in value.items():
                out += [flag, f"{k}={v}"]
        elif isinstance(value, (list, tuple)):
            for v in value:
                out += [flag, os.fspath(v) if isinstance(v, os.PathLike) else str(v)]
        else:
            out += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return out


def _tables(report: Any) -> dict[str, pl.DataFrame]:
    """Each top-level list of records of a report as a frame (lists that do not fit a
    frame, such as records of varying nested shapes, are left in ``report`` only)."""
    tables: dict[str, pl.DataFrame] = {}
    if not isinstance(report, dict):
        return tables
    for key, value in report.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            try:
                tables[key] = pl.from_dicts(value, infer_schema_length=None)
            except Exception:  # noqa: BLE001 - a table that does not fit stays JSON
                continue
    return tables


def _run(tool: str, argv: list[str]) -> ToolResult:
    text, code = _native.run_json(tool, argv)
    report = json.loads(text)
    return ToolResult(report=report, exit_code=code, tables=_tables(report))


def dumpdiff(
    self_hosted_dir: PathLike,
    *,
    step: int,
    weaver_dir: PathLike | None = None,
    remote_api_dir: PathLike | None = None,
    **flags: Any,
) -> ToolResult:
    """``dumpdiff`` on two or three dump trees of one step; every other flag of the command
    as a keyword (``atol=1e-6``, ``ranks="0,1"``, ``fail_on="warning"``, ``tol_file=…``).

    >>> r = dumpdiff("fixtures/dumps/self_hosted_pt", weaver_dir="fixtures/dumps/weaver_faulty_pt", step=0)
    >>> r.exit_code, "worst" in r.tables
    (1, True)
    """
    argv = _argv(
        {
            "self_hosted_dir": self_hosted_dir,
            "weaver_dir": weaver_dir,
            "remote_api_dir": remote_api_dir,
            "step": step,
            **flags,
        }
    )
    return _run("dumpdiff", argv)


def losscheck(**flags: Any) -> ToolResult:
    """``losscheck`` with its flags as keywords (``dump_dir=…``, ``step=0``,
    ``preset="nexrl-is"``, ``inputs=…``).

    >>> r = losscheck(dump_dir="fixtures/dumps/weaver_pt", step=0)
    >>> r.exit_code in (0, 1)
    True
    """
    return _run("losscheck", _argv(flags))


def logscan(
    paths: PathLike | Iterable[PathLike], *, frame: bool = True, **flags: Any
) -> ToolResult:
    """``logscan`` on log files or run folders, detector flags and the rest as keywords
    (``zero_loss=True``, ``threshold={"grad_spike_z": 8}``, ``compare=True``,
    ``fail_on="warning"``). With ``frame`` (and without ``compare``), ``tables["frame"]``
    holds the log frame, read again by :func:`read_logs`.

    >>> r = logscan("fixtures/logs/debug_faults/steps.jsonl", zero_loss=True, nan_grad=True)
    >>> r.exit_code, [f["detector"] for f in r.report["findings"]][:1]
    (1, ['nan-grad'])
    """
    ps = _paths(paths)
    result = _run("logscan", ps + _argv(flags))
    if frame and not flags.get("compare"):
        opts: dict[str, Any] = {}
        if flags.get("aliases") is not None:
            opts["aliases"] = flags["aliases"]
        run = flags.get("run")
        if isinstance(run, str):
            opts["run"] = run
        result.tables["frame"] = read_logs(ps, **opts)
    return result


def mismatch(path: PathLike, **flags: Any) -> ToolResult:
    """``mismatch`` (trainer vs rollout log-prob mismatch) on a dump or run folder, its
    flags as keywords (``step=[3]``, ``pair="rollout:old"``, ``top=10``)."""
    return _run("mismatch", [os.fspath(path)] + _argv(flags))
