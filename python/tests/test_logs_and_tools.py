"""read_logs/read_events against the log file itself, the commands from Python, the console
entry points' exit codes, and bad inputs raising RlforensicsError."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import polars as pl
import pytest

import rlforensics as rf

from conftest import DUMPS, FIXTURES

STEPS = FIXTURES / "logs" / "debug_faults" / "steps.jsonl"


def _lines(path: pathlib.Path) -> list[dict]:
    """The file's JSON objects; a broken line (the fixture's truncated last one) is skipped,
    as logscan skips it and counts it among the file's bad lines."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def test_read_logs_holds_every_logged_value() -> None:
    """Every step line of steps.jsonl, its raw numbers and their canonical names, value for
    value (parsed here with json, not by the library)."""
    recs = [r for r in _lines(STEPS) if "step" in r and "train_loss" in r]
    df = rf.read_logs(STEPS, raw=True).sort("step")
    assert df["step"].to_list() == [r["step"] for r in recs]
    assert df["raw:train_loss"].to_list() == [r["train_loss"] for r in recs]
    assert df["grad_norm"].to_list() == pytest.approx([r["grad_norm"] for r in recs], nan_ok=True, rel=0, abs=0)
    assert df["timestamp"].to_list() == [r["timestamp"] for r in recs]
    # A nested metric under its canonical name.
    assert df["reward_mean"].to_list() == [r["metrics"]["reward_mean"] for r in recs]
    plain = rf.read_logs(STEPS)
    assert not any(c.startswith("raw:") for c in plain.columns)
    assert plain.columns[:3] == ["step", "timestamp", "source"]


def test_read_events_holds_every_event() -> None:
    """Every event line, except the DebugTrainer's second copy of an event (same payload
    under 1 s later), which logscan drops and counts."""
    lines = _lines(FIXTURES / "logs" / "debug_faults" / "events.jsonl")
    kept, numbers = [], []
    for i, e in enumerate(lines, start=1):
        prev = kept[-1][1] if kept else None
        body = {k: v for k, v in e.items() if k != "timestamp"}
        if prev is not None and body == {k: v for k, v in prev.items() if k != "timestamp"} and (
            e["timestamp"] - prev["timestamp"] < 1.0
        ):
            continue
        kept.append((i, e))
    df = rf.read_events(FIXTURES / "logs" / "debug_faults")
    assert len(kept) == 2 and len(lines) == 3
    assert df["kind"].to_list() == [e["event"] for _, e in kept]
    assert df["line"].to_list() == [i for i, _ in kept]
    assert df["step"].to_list() == [e["step"] for _, e in kept]
    assert df["timestamp"].to_list() == [e["timestamp"] for _, e in kept]
    assert df["level"].to_list() == [e["level"] for _, e in kept]
    assert df["nan_count"].to_list() == [3.0, None]
    assert df["token_counts"].to_list() == [None, [8.0, 8.0, 0.0, 0.0]]
    assert df["indices"].to_list() == [None, [2.0, 3.0]]


def test_missing_path_raises() -> None:
    with pytest.raises(rf.RlforensicsError) as e:
        rf.read_dump("no/such/dir")
    assert isinstance(e.value, ValueError)
    assert e.value.kind == "io" and e.value.path == "no/such/dir"
    assert "no/such/dir" in str(e.value)
    with pytest.raises(rf.RlforensicsError):
        rf.read_logs("no/such/steps.jsonl")


def test_corrupt_dump_raises_with_file_and_position(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "forward_data"
    folder.mkdir()
    target = folder / "step_000000_rank0_micro0.pt"
    shutil.copy(FIXTURES / "corrupt" / "pt" / "truncated.pt", target)
    with pytest.raises(rf.RlforensicsError) as e:
        rf.read_dump(tmp_path)
    assert e.value.kind == "format"
    assert e.value.path == str(target)
    assert e.value.position
    assert str(e.value).startswith(f"{target}: {e.value.position}: ")


def test_empty_log_raises_like_logscan(tmp_path: pathlib.Path) -> None:
    empty = tmp_path / "steps.jsonl"
    empty.write_text("")
    with pytest.raises(rf.RlforensicsError) as e:
        rf.read_logs(empty)
    assert "nothing to scan" in str(e.value)


def test_dumpdiff_from_python() -> None:
    r = rf.dumpdiff(DUMPS / "self_hosted_pt", weaver_dir=DUMPS / "weaver_faulty_pt", step=0)
    assert r.exit_code == 1 and r.report["verdict"] == "fail"
    assert r.report["schema_version"] == 1
    assert {"sections", "worst", "coverage", "offending_files"} <= set(r.tables)
    assert r.tables["worst"].height == len(r.report["worst"])
    clean = rf.dumpdiff(DUMPS / "self_hosted_pt", weaver_dir=DUMPS / "weaver_pt", step=0)
    assert clean.exit_code == 0, clean.report["verdict"]
    with pytest.raises(rf.RlforensicsError) as e:
        rf.dumpdiff(DUMPS / "self_hosted_pt", weaver_dir=DUMPS / "weaver_pt", step=0, no_such_flag=1)
    assert e.value.kind == "usage" and "--no-such-flag" in str(e.value)


def test_logscan_and_losscheck_from_python() -> None:
    r = rf.logscan(STEPS, zero_loss=True, nan_grad=True)
    assert r.exit_code == 1
    assert {f["detector"] for f in r.report["findings"]} == {"zero-loss", "nan-grad"}
    assert r.tables["findings"].height == len(r.report["findings"])
    assert r.tables["frame"].equals(rf.read_logs(STEPS))
    lc = rf.losscheck(dump_dir=DUMPS / "weaver_pt", step=0)
    assert lc.exit_code == 0 and lc.report["schema_version"] == 1


SCRIPTS = pathlib.Path(sys.executable).parent


def _script(name: str) -> str:
    path = SCRIPTS / name
    if not path.exists():
        pytest.skip(f"skipped: console script {name} not installed beside {sys.executable}")
    return str(path)


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["dumpdiff", "--self-hosted-dir", "fixtures/dumps/self_hosted_pt", "--weaver-dir",
          "fixtures/dumps/weaver_faulty_pt", "--step", "0", "-q"], 1),
        (["dumpdiff", "--self-hosted-dir", "fixtures/dumps/self_hosted_pt", "--weaver-dir",
          "fixtures/dumps/weaver_pt", "--step", "0", "-q"], 0),
        (["dumpdiff", "--inspect", "no/such.pt"], 2),
        (["dumpdiff", "--no-such-flag"], 2),
        (["dumpdiff", "--help"], 0),
        (["logscan", "fixtures/logs/debug_faults/steps.jsonl", "--nan-grad", "-q"], 1),
        (["logscan", "fixtures/logs/healthy", "-q"], 0),
        (["losscheck", "--dump-dir", "fixtures/dumps/weaver_pt", "--step", "0", "-q"], 0),
        (["postmortem", "--version"], 0),
        (["mismatch", "--help"], 0),
    ],
)
def test_entry_points_exit_codes(argv: list[str], code: int) -> None:
    p = subprocess.run([_script(argv[0]), *argv[1:]], capture_output=True, text=True)
    assert p.returncode == code, p.stderr
    if code == 2 and "--no-such-flag" not in argv:
        assert p.stderr.startswith(f"{argv[0]}: "), p.stderr


def test_entry_point_prints_what_run_json_returns(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "r.json"
    p = subprocess.run(
        [_script("logscan"), str(STEPS), "--zero-loss", "--format", "json", "--output", str(out)],
        capture_output=True, text=True,
    )
    assert p.returncode == 1
    assert json.loads(p.stdout) == rf.logscan(STEPS, zero_loss=True).report == json.loads(out.read_text())
