"""The docstrings' examples run (doctest, from the repository root) and the README's
notebook session runs."""

from __future__ import annotations

import doctest
import re

import rlforensics

from conftest import REPO


def test_docstring_examples_run() -> None:
    result = doctest.testmod(rlforensics, verbose=False)
    assert result.attempted >= 10, result
    assert result.failed == 0, result


def test_readme_session_runs() -> None:
    text = (REPO / "python" / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1
    env: dict = {}
    exec(compile(blocks[0], "python/README.md", "exec"), env)  # noqa: S102 - our own README
    assert env["r"].exit_code == 1
    assert env["tokens"].height > 0 and env["logs"].height > 0
