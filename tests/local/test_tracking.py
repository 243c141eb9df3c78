"""Run tracking (train/observe/tracking.py) from a real local run: TensorBoard event
files read back with TensorBoard's own reader, and the W&B offline run
directory, hold the values the run logged to metrics.jsonl.
Tests that start no process: tests/unit/test_tracking_units.py."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEP_TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "perf/tokens_per_s",
    "mfu": "perf/mfu",
    "data_wait_s": "perf/data_wait_s",
}


def metrics(run_dir: Path) -> tuple[dict[int, dict], list[dict]]:
    steps, events = {}, []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "event" in rec:
            events.append(rec)
        else:
            steps[rec["step"]] = rec
    return steps, events


def wandb_records(path: Path) -> list:
    """Records of a W&B transaction log (.wandb: LevelDB log framing, W&B's
    own header, protobuf ``Record`` messages from wandb's package)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0)
    block, pos, records, partial = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer: zero padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        partial = chunk if kind in (1, 2) else partial + chunk
        if kind in (1, 4):  # FULL or LAST
            rec = pb.Record()
            rec.ParseFromString(partial)
            records.append(rec)
    return records


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("tracking") / "run"
    p = subprocess.run(
        [sys.executable, "-m", "launcher", f"launcher.run_dir={run_dir}", "train.steps=10"]
        + ["train.log_every_steps=5", "train.wandb=offline", "train.wandb_project=meshrun-test"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "WANDB_SILENT": "true"},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return run_dir


def test_tensorboard_event_files_hold_the_logged_values(tracked_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps, events = metrics(tracked_run)
    assert sorted(steps) == [1, 5, 10]
    acc = EventAccumulator(str(tracked_run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {*STEP_TAGS.values(), "perf/data_wait_pct", "checkpoint/stall_s"} <= tags
    for key, tag in STEP_TAGS.items():
        got = {e.step: e.value for e in acc.Scalars(tag)}
        assert sorted(got) == [1, 5, 10], tag
        for step, value in got.items():
            assert value == pytest.approx(steps[step][key], rel=1e-6, abs=1e-9), (tag, step)
    (ckpt,) = [e for e in events if e["event"] == "checkpoint"]
    (stall,) = acc.Scalars("checkpoint/stall_s")
    assert stall.step == ckpt["step"] == 10 and stall.value == pytest.approx(ckpt["save_s"], rel=1e-6)


def test_wandb_offline_run_holds_the_logged_values(tracked_run: Path) -> None:
    steps, events = metrics(tracked_run)
    (log,) = (tracked_run / "wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(log)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.project == "meshrun-test" and run.run_id.startswith("meshrun-")
    history: dict[int, dict[str, float]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            history.setdefault(int(items["_step"]), {}).update(items)
    assert sorted(history) == [1, 5, 10]
    for step, row in history.items():
        for key, tag in STEP_TAGS.items():
            assert row[tag] == pytest.approx(steps[step][key], rel=1e-9, abs=1e-12), (tag, step)
    (ckpt,) = [e for e in events if e["event"] == "checkpoint"]
    assert history[10]["checkpoint/stall_s"] == pytest.approx(ckpt["save_s"])
