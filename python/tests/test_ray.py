"""The Ray recipes (python/examples/ray_dumpdiff.py, ray_logscan.py) end to end on a local
Ray with 2 CPUs and an S3 server on 127.0.0.1 (moto's ThreadedMotoServer), against the
single-machine reports; and the wheel's own functions on s3:// URLs. Never the internet.

Slow (Ray starts its processes: about a minute on 2 cores): marked ``slow``; skipped when
ray, moto[server] or boto3 are not importable, unless RLF_REQUIRE_RAY is set.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import pytest

import rlforensics as rf

from conftest import DUMPS, FIXTURES, REPO

EXAMPLES = REPO / "python" / "examples"

pytestmark = pytest.mark.slow

if not os.environ.get("RLF_REQUIRE_RAY"):
    pytest.importorskip("ray")
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    pytest.importorskip("pyarrow.fs")

import boto3  # noqa: E402
import pyarrow.fs as pafs  # noqa: E402
import ray  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

sys.path.insert(0, str(EXAMPLES))
import ray_dumpdiff  # noqa: E402
import ray_logscan  # noqa: E402

#: local folder → key prefix in "bucket"
UPLOADS = {
    DUMPS / "self_hosted_pt": "run/self_hosted",
    DUMPS / "weaver_faulty_pt": "run/weaver",
    FIXTURES / "logs" / "healthy": "runs/healthy",
    FIXTURES / "logs" / "debug_faults": "runs/debug_faults",
}


@pytest.fixture(scope="module")
def s3() -> pafs.S3FileSystem:
    """moto on a free port of 127.0.0.1 holding the fixture trees; the AWS_* environment
    the wheel reads set to it; the pyarrow filesystem the recipes take."""
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
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="bucket")
    for local, prefix in UPLOADS.items():
        for p in sorted(local.rglob("*")):
            if p.is_file():
                client.upload_file(str(p), "bucket", f"{prefix}/{p.relative_to(local).as_posix()}")
    yield ray_dumpdiff.filesystem_from_env()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.fixture(scope="module")
def local_ray(s3):
    """A Ray of 2 CPUs on this machine; its workers import the recipes (PYTHONPATH) and
    inherit the S3 environment."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(EXAMPLES)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _as_urls(report: dict, pairs: dict[str, str]) -> dict:
    """The report with each local path of ``pairs`` written as its URL."""
    text = json.dumps(report, ensure_ascii=False)
    for local, url in pairs.items():
        text = text.replace(local, url)
    return json.loads(text)


#: the kind folders of step 0 in the two trees
KINDS_STEP0 = sorted(
    {p.parent.name for d in ("self_hosted_pt", "weaver_faulty_pt") for p in (DUMPS / d).rglob("step_000000*")}
)

SH, WV = "s3://bucket/run/self_hosted", "s3://bucket/run/weaver"
LOCAL_SIDES = {"fixtures/dumps/self_hosted_pt": SH, "fixtures/dumps/weaver_faulty_pt": WV}


def test_wheel_functions_take_s3_urls(s3) -> None:
    before = rf.fetch_stats()
    remote = rf.dumpdiff(SH, weaver_dir=WV, step=0)
    after = rf.fetch_stats()
    local = rf.dumpdiff("fixtures/dumps/self_hosted_pt", weaver_dir="fixtures/dumps/weaver_faulty_pt", step=0)
    assert (remote.exit_code, local.exit_code) == (1, 1)
    assert remote.report == _as_urls(local.report, LOCAL_SIDES)
    step0 = sum(
        p.stat().st_size
        for d in ("self_hosted_pt", "weaver_faulty_pt")
        for p in (DUMPS / d).rglob("step_000000*")
    )
    fetched = after["bytes"] - before["bytes"]
    assert step0 <= fetched <= 1.1 * step0
    frames = rf.read_dump(SH + "/forward_data/step_000000_rank4_micro0.pt")
    want = rf.read_dump("fixtures/dumps/self_hosted_pt/forward_data/step_000000_rank4_micro0.pt")
    assert frames["tokens"].equals(want["tokens"])
    with pytest.raises(rf.RlforensicsError, match="s3://bucket/run/nothing"):
        rf.dumpdiff("s3://bucket/run/nothing", weaver_dir=WV, step=0)


def test_ray_dumpdiff_gives_the_single_machine_report(s3, local_ray, tmp_path) -> None:
    t = time.monotonic()
    # The Parquet goes to a local folder: one machine here (on a cluster it is a URL on
    # the shared store; moto 5.2.1 fails pyarrow's CompleteMultipartUpload).
    reports = ray_dumpdiff.run(SH, WV, work=str(tmp_path / "work"), filesystem=s3)
    print(f"ray_dumpdiff: {time.monotonic() - t:.1f} s for {len(reports)} steps")
    local = rf.dumpdiff("fixtures/dumps/self_hosted_pt", weaver_dir="fixtures/dumps/weaver_faulty_pt", step=0)
    # Step 0 as on one machine; step -1 (a trajectory file on one side only) is what the
    # command says for it: exit 2 naming the step's absence.
    assert sorted(reports) == [-1, 0]
    report, code = reports[0]
    assert code == local.exit_code == 1
    assert report == _as_urls(local.report, LOCAL_SIDES)
    assert reports[-1][1] == 2 and "error" in reports[-1][0]
    # The partitioned Parquet the pipeline left: one folder per step, one per kind in it.
    files = tmp_path / "work" / "files"
    assert sorted(p.name for p in files.iterdir()) == ["step=-1", "step=0"]
    kinds = sorted(p.name for p in (files / "step=0").iterdir())
    assert kinds == sorted(f"kind={k}" for k in KINDS_STEP0)


def test_ray_logscan_gives_each_runs_report(s3, local_ray) -> None:
    t = time.monotonic()
    reports = ray_logscan.run("s3://bucket/runs", filesystem=s3)
    print(f"ray_logscan: {time.monotonic() - t:.1f} s for {len(reports)} runs")
    assert sorted(reports) == ["debug_faults", "healthy"]
    for run in ("healthy", "debug_faults"):
        local = rf.logscan(f"fixtures/logs/{run}", frame=False)
        report, code = reports[run]
        assert code == local.exit_code
        assert report == _as_urls(local.report, {f"fixtures/logs/{run}": f"s3://bucket/runs/{run}"})
