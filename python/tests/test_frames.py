"""read_dump's frames against the generator's manifest, value for value (the truth
tests/dumps.rs checks the Rust frames against), and the frames' Arrow crossing."""

from __future__ import annotations

import math

import polars as pl
import pytest

import rlforensics as rf
from rlforensics import _native

from conftest import DUMPS

TREES = [
    "self_hosted_pt",
    "self_hosted_jsonl",
    "remote_api_pt",
    "remote_api_jsonl",
    "weaver_pt",
    "weaver_jsonl",
    "weaver_faulty_pt",
]


def num(x):
    """The manifest's numbers: Python reprs as strings ('nan', 'inf' included), ints, bools."""
    if x is None:
        return None
    if isinstance(x, bool):
        return float(x)
    return float(x)


def text(x):
    if x is None:
        return None
    if isinstance(x, str):
        return x
    if isinstance(x, bool):
        return "true" if x else "false"
    return str(x)


def at_file(df: pl.DataFrame, f: dict) -> pl.DataFrame:
    cond = (pl.col("kind") == f["kind"]) & (pl.col("step") == f["step"])
    for c in ("rank", "micro"):
        if f[c] is not None:
            cond = cond & (pl.col(c) == f[c])
    return df.filter(cond)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("tree", TREES)
def test_frames_match_the_generator_manifest(tree: str, manifest: dict) -> None:
    frames = rf.read_dump(DUMPS / tree)
    assert list(frames) == ["scalars", "tokens", "trajectories"]
    counts = {"trajectories": 0, "tensors": 0, "scalars": 0}
    for f in (x for x in manifest["files"] if x["tree"] == tree):
        path = f["path"]
        items = (f.get("trajectories") or {}).get("items")
        if items is not None:
            rows = at_file(frames["trajectories"], f).sort("index")
            assert rows.height == len(items), path
            adv = (f.get("scalars") or {}).get("advantages")
            for i, it in enumerate(items):
                r = rows.row(i, named=True)
                assert r["index"] == it["index"], path
                assert r["length"] == it["length"], f"{path}[{i}] length"
                assert r["reward"] == num(it.get("reward")), f"{path}[{i}] reward"
                assert r["loss_mask_sum"] == num(it.get("loss_mask_sum")), f"{path}[{i}] mask"
                want_adv = num(adv[i]) if adv is not None else None
                assert r["advantage"] == want_adv, f"{path}[{i}] advantage"
                for key in ("group_id", "uid", "run_id"):
                    assert r[key] == text(it.get(key)), f"{path}[{i}] {key}"
                assert r["is_val"] == it.get("is_val"), f"{path}[{i}] is_val"
                counts["trajectories"] += 1
        tensors = f["tensors"]
        ref = tensors.get("log_probs") or tensors.get("old_log_probs")
        if ref is not None and f["kind"] in ("forward_data", "is_loss_debug", "old_log_probs"):
            rows = at_file(frames["tokens"], f).sort(["row", "pos"])
            for key, exp in tensors.items():
                if exp["shape"] != ref["shape"]:
                    continue
                vals = rows[key].to_list()
                assert len(vals) == exp["numel"], f"{path} {key}"
                assert sum(math.isnan(v) for v in vals) == exp["nan_count"], f"{path} {key}"
                # fsum of the f64 values is the manifest's exactly rounded sum: equality.
                assert math.fsum(v for v in vals if not math.isnan(v)) == num(exp["sum"]), (
                    f"{path} {key}"
                )
                for got, want in zip(vals, exp["first4"]):
                    assert same(got, num(want)), f"{path} {key} first4"
                counts["tensors"] += 1
        if f["kind"] == "loss":
            rows = at_file(frames["scalars"], f)
            got = dict(zip(rows["key"].to_list(), rows["value"].to_list()))
            for key, exp in f["scalars"].items():
                if isinstance(exp, (bool, list, dict)) or exp is None:
                    continue
                try:
                    want = float(exp)
                except (TypeError, ValueError):
                    continue
                assert key in got, f"{path}: no scalar {key}"
                assert same(got[key], want), f"{path} {key}: {got[key]} vs {want}"
                counts["scalars"] += 1
    assert sum(counts.values()) > 0, counts


def test_every_tree_checked_something(manifest: dict) -> None:
    """The manifest loop above is not vacuous: the trees hold trajectories, per-token
    tensors and loss scalars (the Rust test's floors)."""
    kinds = {f["kind"] for f in manifest["files"]}
    assert {"trajectory", "forward_data", "loss"} <= kinds
    trajs = sum(
        len((f.get("trajectories") or {}).get("items") or []) for f in manifest["files"]
    )
    assert trajs >= 4 * 48


def test_step_filter_and_one_file() -> None:
    all_steps = rf.read_dump(DUMPS / "self_hosted_pt")
    step0 = rf.read_dump(DUMPS / "self_hosted_pt", step=0)
    assert set(step0["tokens"]["step"].unique().to_list()) == {0}
    assert set(all_steps["trajectories"]["step"].unique().to_list()) == {-1, 0}
    one = rf.read_dump(DUMPS / "self_hosted_pt/forward_data/step_000000_rank4_micro0.pt")
    assert one["tokens"].height == 2 * one["tokens"]["pos"].n_unique()
    assert one["tokens"]["rank"].unique().to_list() == [4]


def test_arrow_crossing_shares_the_buffers() -> None:
    """Two imports of one exported frame see the same memory: the stream hands over the
    Rust buffers, no copy is made on either side (numpy views polars' buffer without a
    copy, or raises)."""
    np = pytest.importorskip("numpy")
    native = _native.read_dump(str(DUMPS / "self_hosted_pt"), 0)["tokens"]
    a, b = pl.DataFrame(native), pl.DataFrame(native)
    for col in ("row", "pos", "step"):
        va = a[col].to_numpy(allow_copy=False)
        vb = b[col].to_numpy(allow_copy=False)
        pa_, pb_ = va.__array_interface__["data"][0], vb.__array_interface__["data"][0]
        assert pa_ == pb_ and pa_ != 0, col
        assert np.shares_memory(va, vb), col
    assert a.equals(b)
    assert native.height == a.height and native.columns == a.columns


def test_pyarrow_reads_the_same_stream() -> None:
    pa = pytest.importorskip("pyarrow")
    native = _native.read_dump(str(DUMPS / "weaver_pt"), 0)["trajectories"]
    table = pa.table(native)
    assert pl.from_arrow(table).equals(pl.DataFrame(native))


def test_pandas_reads_the_same_stream() -> None:
    """pandas takes the exported stream itself (pandas >= 3.0 `DataFrame.from_arrow` reads any
    `__arrow_c_stream__` object), value for value the polars frame's."""
    pd = pytest.importorskip("pandas")
    if not hasattr(pd.DataFrame, "from_arrow"):
        pytest.skip(f"pandas {pd.__version__} has no DataFrame.from_arrow (pandas >= 3.0)")
    native = _native.read_dump(str(DUMPS / "weaver_pt"), 0)["tokens"]
    got = pd.DataFrame.from_arrow(native)
    want = pl.DataFrame(native)
    assert list(got.columns) == want.columns
    assert len(got) == want.height > 0
    for col in want.columns:
        # a null arrives in pandas as its missing value (NaN / None / NA by dtype)
        nulls = want[col].is_null().to_list()
        assert got[col].isna().tolist() == nulls, col
        kept = [v for v, n in zip(got[col].tolist(), nulls) if not n]
        assert kept == want[col].drop_nulls().to_list(), col


def test_a_stacks_dump_reads_by_role() -> None:
    """A verl DataProto tree (written by verl 0.9.1's own save_to_disk) reads into the same
    three frames, its log-probs in the model's role names, equal to the generator's
    manifest at each row's response positions."""
    import json

    stacks = DUMPS.parent / "stacks"
    manifest = json.loads((stacks / "manifest.json").read_text())
    frames = rf.read_dump(stacks / "verl", step=3)
    tokens = frames["tokens"]
    for column in ["log_probs_rollout", "log_probs_old", "log_probs_reference"]:
        assert column in tokens.columns
    row0 = tokens.filter((pl.col("row") == 0) & (pl.col("response_mask") == 1)).sort("pos")
    want = manifest["rows"][0]["old"]
    got = row0["log_probs_old"].to_list()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert abs(g - w) <= 1e-7 * max(1.0, abs(w))
    assert frames["trajectories"].height == len(manifest["rows"])


def test_a_stacks_text_is_in_the_trajectories() -> None:
    """verl's generation dumps (written by verl 0.9.1's own _write_generations) carry the
    decoded prompt and response into the model's rows, and so into the frame."""
    stacks = DUMPS.parent / "stacks"
    traj = rf.read_dump(stacks / "verl_generations", step=3)["trajectories"]
    assert traj["prompt"].to_list() == [f"prompt {i}" for i in range(4)]
    assert traj["response"].to_list() == [f"response {i} \u00e9" for i in range(4)]
