"""Shared paths: the repository's fixtures (the same files and manifest the Rust tests use)."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
DUMPS = FIXTURES / "dumps"


@pytest.fixture(scope="session")
def manifest() -> dict:
    """The dump generator's manifest (fixtures/expected/manifest.json): per file, each
    tensor's numel, NaN count, exactly rounded sum and first four elements, each
    trajectory's fields, each scalar, written by fixtures/gen from the tensors it saved."""
    return json.loads((FIXTURES / "expected" / "manifest.json").read_text())


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run each test from the repository root so fixture paths read as in the README."""
    monkeypatch.chdir(REPO)
    os.environ.setdefault("NO_COLOR", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: starts a local Ray and an S3 server (test_ray.py); deselect with -m 'not slow'"
    )
