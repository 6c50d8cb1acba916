#!/usr/bin/env python3
"""Write large tracker files for benches/trackers_bench.sh (NOT committed):

    python3 benches/gen_trackers.py tfevents OUT_DIR SIZE_MB
    python3 benches/gen_trackers.py wandb    OUT_DIR SIZE_MB
    python3 benches/gen_trackers.py read-wandb RUN_DIR 0   # the Python baseline reader

tfevents: what torch's SummaryWriter writes (one Event per add_scalar, simple_value),
8 tags per step, framed as TFRecords with masked CRC-32C (pip install crc32c).
wandb: a `:W&B` transaction log of History records (8 metrics, `_step`, `_timestamp`,
`_runtime`, values as JSON text) in the LevelDB-log framing, built with wandb's own
protobuf classes; records split across 32 KiB blocks as the writer does.
mlflow / mlflow_db / csv (logscan's other tracker readers, no Python baseline):

    python3 benches/gen_trackers.py mlflow    OUT_DIR SIZE_MB   # file store, metrics/ files
    python3 benches/gen_trackers.py mlflow_db OUT_DIR SIZE_MB   # SQLite backend, mlflow.db
    python3 benches/gen_trackers.py csv       OUT_DIR SIZE_MB   # plain metric table

The MLflow ones start from the repository's fixtures, which mlflow itself wrote
(fixtures/gen/make_trackers.py: meta.yaml files, tags, params, the SQLite schema), and
grow their metric history in the same shape: a file-store metric file is one
`<timestamp ms> <value> <step>` line per step (mlflow/store/tracking/file_store.py,
`_log_run_metric`, as the fixture's files show); the SQLite rows are
`(key, value, timestamp, run_uuid, step, is_nan)` in the `metrics` table. SIZE_MB counts
metric bytes (file store, CSV) or the database file (SQLite).
"""
import os
import struct
import sys
import zlib

KEYS = ["train/loss", "train/grad_norm", "train/reward", "train/reward_std",
        "train/frac_reward_zero_std", "train/entropy", "train/kl", "timing_s/step"]


def masked(data):
    import crc32c
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfevents(out_dir, size):
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "events.out.tfevents.1700000000.bench.1.0")
    with open(path, "wb") as f:
        def rec(data):
            n = struct.pack("<Q", len(data))
            f.write(n + struct.pack("<I", masked(n)) + data + struct.pack("<I", masked(data)))
        rec(Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString())
        step, written = 0, 0
        while written < size:
            for i, k in enumerate(KEYS):
                v = 0.5 + 0.001 * ((step * 7 + i * 13) % 997)
                e = Event(wall_time=1.7e9 + step, step=step,
                          summary=Summary(value=[Summary.Value(tag=k, simple_value=v)]))
                data = e.SerializeToString()
                rec(data)
                written += len(data) + 16
            step += 1
    return path


def wandb(out_dir, size):
    from wandb.proto import wandb_internal_pb2 as pb
    run_dir = os.path.join(out_dir, "wandb", "offline-run-20250101_000000-bench")
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "run-bench.wandb")
    block = 32768
    with open(path, "wb") as f:
        f.write(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
        pos = 7

        def put(data):
            nonlocal pos
            first = True
            while True:
                left = block - pos % block
                if left < 7:
                    f.write(b"\0" * left)
                    pos += left
                    continue
                n = min(len(data), left - 7)
                last = n == len(data)
                typ = 1 if first and last else 2 if first else 4 if last else 3
                chunk = data[:n]
                crc = zlib.crc32(chunk, zlib.crc32(bytes([typ]))) & 0xFFFFFFFF
                f.write(struct.pack("<IHB", crc, n, typ) + chunk)
                pos += 7 + n
                data = data[n:]
                first = False
                if last:
                    return

        step = 0
        while pos < size:
            r = pb.Record(num=step + 1)
            h = r.history
            for i, k in enumerate(KEYS):
                it = h.item.add()
                it.nested_key.append(k)
                v = 0.5 + 0.001 * ((step * 7 + i * 13) % 997)
                it.value_json = "NaN" if (step % 1000 == 17 and i == 1) else repr(v)
            for k, v in (("_step", str(step)), ("_timestamp", repr(1.7e9 + step)),
                         ("_runtime", repr(0.5 * step))):
                it = h.item.add()
                it.nested_key.append(k)
                it.value_json = v
            h.step.num = step
            put(r.SerializeToString())
            step += 1
    return path


def value(step, i):
    return 0.5 + 0.001 * ((step * 7 + i * 13) % 997)


def mlflow(out_dir, size):
    import glob
    import shutil
    src = os.path.join(os.path.dirname(__file__), "..", "fixtures", "trackers", "mlflow", "run_a")
    dst = os.path.join(out_dir, "run")
    shutil.copytree(src, dst)
    metrics = [d for d in glob.glob(os.path.join(dst, "mlruns", "*", "*", "metrics"))][0]
    files = sorted(f for f in glob.glob(os.path.join(metrics, "**"), recursive=True)
                   if os.path.isfile(f))
    outs = [open(f, "w") for f in files]
    step, written = 0, 0
    while written < size:
        t = 1700000000000 + 1000 * step
        for i, f in enumerate(outs):
            line = f"{t} {value(step, i)!r} {step}\n"
            f.write(line)
            written += len(line)
        step += 1
    for f in outs:
        f.close()
    return dst


def mlflow_db(out_dir, size):
    import shutil
    import sqlite3
    src = os.path.join(os.path.dirname(__file__), "..", "fixtures", "trackers", "mlflow_db",
                       "run_a", "mlflow.db")
    os.makedirs(os.path.join(out_dir, "run"), exist_ok=True)
    path = os.path.join(out_dir, "run", "mlflow.db")
    shutil.copy(src, path)
    c = sqlite3.connect(path)
    run, = c.execute("SELECT run_uuid FROM runs").fetchone()
    c.execute("DELETE FROM metrics")
    step = 0
    while os.path.getsize(path) < size:
        rows = []
        for s in range(step, step + 20000):
            t = 1700000000000 + 1000 * s
            rows += [(k, value(s, i), t, run, s, 0) for i, k in enumerate(KEYS)]
        c.executemany("INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) "
                      "VALUES (?, ?, ?, ?, ?, ?)", rows)
        c.commit()
        step += 20000
    c.close()
    return path


def csv(out_dir, size):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "metrics.csv")
    with open(path, "w") as f:
        written = f.write("step," + ",".join(KEYS) + "\n")
        step = 0
        while written < size:
            written += f.write(f"{step}," + ",".join(repr(value(step, i))
                                                    for i in range(len(KEYS))) + "\n")
            step += 1
    return path


def read_wandb(run_dir, _size):
    """The baseline reader: every history row of the .wandb file under run_dir, decoded
    with wandb's own Record class (CRC checked, values parsed as JSON)."""
    import glob
    import json
    from wandb.proto import wandb_internal_pb2 as pb
    path = glob.glob(os.path.join(run_dir, "wandb", "*", "run-*.wandb"))[0]
    data = open(path, "rb").read()
    pos, pending, rows = 7, b"", 0
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        crc, n, t = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + n]
        assert zlib.crc32(chunk, zlib.crc32(bytes([t]))) & 0xFFFFFFFF == crc
        pos += 7 + n
        pending += chunk
        if t in (2, 3):
            continue
        r = pb.Record()
        r.ParseFromString(pending)
        pending = b""
        if r.HasField("history"):
            {".".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            rows += 1
    return rows


if __name__ == "__main__":
    kind, out, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print({"tfevents": tfevents, "wandb": wandb, "read-wandb": read_wandb, "mlflow": mlflow,
           "mlflow_db": mlflow_db, "csv": csv}[kind](out, mb << 20))
