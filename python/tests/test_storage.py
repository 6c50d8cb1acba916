"""The wheel's log readers on object storage (issue 33, docs/storage.md): ``read_logs``,
``read_events``, ``logscan`` and ``mismatch`` given ``s3://`` URLs of log folders, tracker files,
completions and runs, on an S3 server started on 127.0.0.1 (moto's ThreadedMotoServer),
give what they give on the local copy, with the URLs where the local paths were; a
missing object, a bad URL and a missing bucket raise ``RlforensicsError`` naming the URL.
Never the internet. Skipped when moto[server] or boto3 is not importable, unless
RLF_REQUIRE_S3 or RLF_REQUIRE_RAY (.ci/run's pytest) is set.
"""

from __future__ import annotations

import json
import logging
import os

import polars as pl
import pytest

import rlforensics as rf

from conftest import FIXTURES

if not (os.environ.get("RLF_REQUIRE_S3") or os.environ.get("RLF_REQUIRE_RAY")):
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

#: fixture folders uploaded to ``bucket`` under the same relative key
UPLOADS = [
    "logs/debug_faults",
    "trackers/tb",
    "trackers/wandb",
    "trackers/mlflow_db",
    "completions/trl_garbled",
    "runs",
    "stacks/verl",
]


@pytest.fixture(scope="module")
def s3():
    """moto on a free port of 127.0.0.1 holding the fixture folders, and a 1 MB
    checkpoint beside the debug_faults logs; the AWS_* environment set to it."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    # moto keeps one in-memory state per process: another test's server (test_ray.py)
    # may have left objects in a bucket of the same name; start from an empty store
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).read()
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="bucket")
    for rel in UPLOADS:
        local = FIXTURES / rel
        for p in sorted(local.rglob("*")):
            if p.is_file():
                client.upload_file(str(p), "bucket", f"{rel}/{p.relative_to(local).as_posix()}")
    client.put_object(Bucket="bucket", Key="logs/debug_faults/ckpt/model.safetensors", Body=b"\0" * (1 << 20))
    yield client
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.mark.parametrize(
    "rel",
    [
        "logs/debug_faults",
        "logs/debug_faults/steps.jsonl",
        "trackers/tb/run_a",
        "trackers/wandb/run_a",
        "trackers/mlflow_db/run_a/mlflow.db",
    ],
)
def test_read_logs_from_the_store_is_the_local_frame(s3, rel) -> None:
    local = rf.read_logs(f"fixtures/{rel}", raw=True)
    remote = rf.read_logs(f"s3://bucket/{rel}", raw=True)
    assert local.height > 0
    assert remote.equals(local, null_equal=True)


def test_read_events_names_the_urls(s3) -> None:
    local = rf.read_events("fixtures/logs/debug_faults")
    remote = rf.read_events("s3://bucket/logs/debug_faults")
    assert local.height > 0
    assert remote["file"].unique().to_list() == ["s3://bucket/logs/debug_faults/events.jsonl"]
    fixed = remote.with_columns(pl.col("file").str.replace("s3://bucket/", "fixtures/", literal=True))
    assert fixed.equals(local, null_equal=True)


def test_only_the_logs_are_fetched(s3) -> None:
    before = rf.fetch_stats()
    rf.read_logs("s3://bucket/logs/debug_faults")
    after = rf.fetch_stats()
    logs = sum((FIXTURES / "logs/debug_faults" / f).stat().st_size for f in ("events.jsonl", "steps.jsonl"))
    assert after["bytes"] - before["bytes"] == logs


@pytest.mark.parametrize("rel", ["completions/trl_garbled", "runs", "trackers/tb"])
def test_logscan_from_the_store_is_the_local_report(s3, rel) -> None:
    local = rf.logscan(f"fixtures/{rel}", frame=False)
    remote = rf.logscan(f"s3://bucket/{rel}", frame=False)
    assert remote.exit_code == local.exit_code == 1
    text = json.dumps(remote.report).replace("s3://bucket/", "fixtures/")
    assert json.loads(text) == local.report
    assert "rlf-fetch" not in json.dumps(remote.report)


def test_mismatch_from_the_store_is_the_local_report(s3) -> None:
    local = rf.mismatch("fixtures/stacks/verl/step_3")
    remote = rf.mismatch("s3://bucket/stacks/verl/step_3")
    assert remote.exit_code == local.exit_code == 0
    text = json.dumps(remote.report)
    assert "s3://bucket/stacks/verl/step_3" in text
    assert json.loads(text.replace("s3://bucket/", "fixtures/")) == local.report


@pytest.mark.parametrize(
    "url, says",
    [
        ("s3://bucket/logs/nothing.jsonl", "no such object"),
        ("s3:///logs", "not a usable object-store URL"),
        ("s3://no-bucket/logs", "no such bucket"),
    ],
)
def test_store_errors_name_the_url(s3, url, says) -> None:
    for read in (rf.read_logs, rf.read_events):
        with pytest.raises(rf.RlforensicsError) as e:
            read(url)
        assert url in str(e.value) and says in str(e.value)
        assert "rlf-fetch" not in str(e.value)


def test_an_aliases_file_in_the_store_maps_as_the_local_one(s3, tmp_path) -> None:
    """``aliases=`` takes a URL: the user's keys it maps become canonical columns, as with
    the local file (and not without it)."""
    log = tmp_path / "steps.jsonl"
    log.write_text("".join(json.dumps({"step": s, "my_score": 0.5 + s / 100}) + "\n" for s in range(10)))
    aliases = tmp_path / "aliases.json"
    aliases.write_text(json.dumps({"reward_mean": ["my_score"]}))
    s3.upload_file(str(aliases), "bucket", "conf/aliases.json")
    local = rf.read_logs(str(log), aliases=str(aliases))
    remote = rf.read_logs(str(log), aliases="s3://bucket/conf/aliases.json")
    assert "reward_mean" in local.columns
    assert "reward_mean" not in rf.read_logs(str(log)).columns
    assert remote.equals(local, null_equal=True)
