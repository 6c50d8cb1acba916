import os
from dataclasses import dataclass
from typing import Any, Iterable, Union

import polars as pl

from ._native import RlforensicsError as RlforensicsError

__version__: str
PathLike = Union[str, os.PathLike[str]]

def fetch_stats() -> dict[str, int]: ...
def dump_coords(path: PathLike) -> tuple[str, int, int | None, int | None] | None: ...
def read_dump(path: PathLike, step: int | None = None) -> dict[str, pl.DataFrame]: ...
def read_logs(
    paths: PathLike | Iterable[PathLike],
    *,
    raw: bool = False,
    aliases: PathLike | None = None,
    run: str | None = None,
) -> pl.DataFrame: ...
def read_events(
    paths: PathLike | Iterable[PathLike],
    *,
    aliases: PathLike | None = None,
    run: str | None = None,
) -> pl.DataFrame: ...
@dataclass
class ToolResult:
    report: Any
    exit_code: int
    tables: dict[str, pl.DataFrame]

def dumpdiff(
    self_hosted_dir: PathLike,
    *,
    step: int,
    weaver_dir: PathLike | None = None,
    remote_api_dir: PathLike | None = None,
    **flags: Any,
) -> ToolResult: ...
def losscheck(**flags: Any) -> ToolResult: ...
def logscan(
    paths: PathLike | Iterable[PathLike], *, frame: bool = True, **flags: Any
) -> ToolResult: ...
def mismatch(path: PathLike, **flags: Any) -> ToolResult: ...
