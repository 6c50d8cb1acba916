"""The compiled module (Rust, pyo3, abi3-py310). Use the functions of `rlforensics`."""

from typing import Any

__version__: str
TOOLS: list[str]

class RlforensicsError(ValueError):
    """The command line's message (file and position) for an input it cannot use."""

    kind: str
    """`io`, `format`, `usage`, `input`, `export`, `internal`."""
    path: str | None
    position: str | None

class ArrowFrame:
    """A polars-rs frame exported through the Arrow PyCapsule stream interface."""

    @property
    def height(self) -> int: ...
    @property
    def columns(self) -> list[str]: ...
    def __arrow_c_stream__(self, requested_schema: Any | None = None) -> Any: ...

def read_dump(path: str, step: int | None = None) -> dict[str, ArrowFrame]: ...
def _rust_read_dump_seconds(path: str, step: int | None = None, repeats: int = 5) -> float: ...
def read_logs(
    paths: list[str], raw: bool = False, aliases: str | None = None, run: str | None = None
) -> ArrowFrame: ...
def read_events(
    paths: list[str], aliases: str | None = None, run: str | None = None
) -> ArrowFrame: ...
def run_json(tool: str, argv: list[str]) -> tuple[str, int]: ...
def main(tool: str, argv: list[str]) -> int: ...
