"""Console entry points: each runs its command line in the compiled library exactly as the
Rust binary does (same output, same exit codes: 0 clean, 1 found, 2 bad input)."""

from __future__ import annotations

import sys

from . import _native


def _run(tool: str) -> None:
    argv = [tool, *sys.argv[1:]]
    sys.stdout.flush()
    code = _native.main(tool, argv)
    raise SystemExit(code)


def dumpdiff() -> None:
    """`dumpdiff` console script."""
    _run("dumpdiff")


def logscan() -> None:
    """`logscan` console script."""
    _run("logscan")


def losscheck() -> None:
    """`losscheck` console script."""
    _run("losscheck")


def mismatch() -> None:
    """`mismatch` console script."""
    _run("mismatch")


def postmortem() -> None:
    """`postmortem` console script."""
    _run("postmortem")
