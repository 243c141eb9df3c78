"""SIGKILL trials through the real trainer: ``python -m launcher``
(cluster=local, 1 rank) with S3 on moto's HTTP server, killed (launcher and
rank, as a node crash would) while a save or an upload is in flight; every
other restart also loses the node-local tier, so it must resume from S3.
Each restart must resume from the newest checkpoint complete in a tier that
survived, and the run must end with the uninterrupted run's losses."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import TINY_MODEL
from loopback_s3 import BUCKET, S3Server

from launcher.config.runid import read_run_id
from train.checkpoint.manifest import list_steps

REPO = Path(__file__).resolve().parents[2]
STEPS = 100
# A tiny model: a life is mostly process start-up, a save ~ one step.
OVERRIDES = (
    *TINY_MODEL,
    "train.global_batch_size=2",
    "train.warmup_steps=3",
    "train.log_every_steps=1",
    f"train.steps={STEPS}",
    "parallelism=fsdp",
    "parallelism.precision=fp32",
    "cluster.local_processes=1",
    "cluster.metrics_port=0",
    "storage.save_every_steps=2",
    "storage.keep_local=2",
    "storage.upload_retry_max_s=0.5",
)


def start(run_dir: Path, s3: S3Server | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(
        PYTHONPATH=str(REPO),
        OMP_NUM_THREADS="1",
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="x",
        AWS_DEFAULT_REGION="us-east-1",
    )
    s3_args = [f"storage.s3_bucket={BUCKET}", f"storage.s3_endpoint_url={s3.url}"] if s3 else []
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "launcher",
            f"launcher.run_dir={run_dir}",
            f"hydra.run.dir={run_dir}/hydra",
            *OVERRIDES,
            *s3_args,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        start_new_session=True,
    )


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def lives(run_dir: Path) -> list[int]:
    """The first step of each life so far (from rank 0's log: 'steps A..B')."""
    log = run_dir / "logs" / "rank0.log"
    text = log.read_text() if log.exists() else ""
    return [int(m) - 1 for m in re.findall(r", steps (\d+)\.\.\d+", text)]


def losses(run_dir: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:
            out.setdefault(r["step"], r["loss"])
            # Every re-run of a step (after a resume) reproduces it.
            assert abs(r["loss"] - out[r["step"]]) <= 1e-6, (r, out[r["step"]])
    return out


def newest_step(metrics: Path, offset: int) -> int:
    """The newest step logged after byte ``offset`` of metrics.jsonl."""
    if not metrics.exists():
        return 0
    with open(metrics, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    steps = [json.loads(x).get("step", 0) for x in lines if x.endswith("}")]
    return max(steps, default=0)


def in_flight(ckpts: Path) -> tuple[bool, bool]:
    """(a save in flight: a step directory without manifest, an upload in
    flight: the newest complete local step not yet marked uploaded)."""
    complete = list_steps(ckpts)
    saving = bool(set(list_steps(ckpts, complete_only=False)) - set(complete))
    uploading = bool(complete) and not (ckpts / f"step_{complete[-1]}" / ".uploaded-s3").exists()
    return saving, uploading


# CI kills 10 lives; the 20-kill campaign is opt-in: pytest -m campaign.
@pytest.mark.slow
@pytest.mark.parametrize(
    "trials", [pytest.param(10, id="ci"), pytest.param(20, id="campaign", marks=pytest.mark.campaign)]
)
def test_sigkill_trials_through_the_real_trainer(tmp_path: Path, trials: int) -> None:
    t_start = time.monotonic()
    ref_dir = tmp_path / "ref"
    ref = start(ref_dir, None)
    assert ref.wait(300) == 0
    ref_losses = losses(ref_dir)
    assert sorted(ref_losses) == list(range(1, STEPS + 1))

    s3 = S3Server()
    s3.start()
    s3.client().create_bucket(Bucket=BUCKET)
    rng = random.Random(11)
    run_dir = tmp_path / "kill"
    ckpts = run_dir / "checkpoints"
    expected, report = [0], []
    saves = uploads = 0
    try:
        for trial in range(trials):
            metrics = run_dir / "metrics.jsonl"
            offset = metrics.stat().st_size if metrics.exists() else 0
            proc = start(run_dir, s3)
            deadline = time.monotonic() + 120
            while len(lives(run_dir)) < trial + 1:  # this life has resumed and started training
                assert time.monotonic() < deadline and proc.poll() is None, f"trial {trial}: no start"
                time.sleep(0.02)
            run_id = read_run_id(run_dir)
            # Let it train a random number of steps, then kill it while a save
            # or an upload is in flight.
            target = lives(run_dir)[-1] + rng.randint(1, 7)
            while newest_step(metrics, offset) < target:
                assert time.monotonic() < deadline and proc.poll() is None, f"trial {trial}: stalled"
                time.sleep(0.01)
            lost = trial % 2 == 1  # this trial's node loses its disk: only S3 remains
            if lost:
                # A resume from S3 must be possible: wait for a copy newer
                # than this life's start to be complete there.
                start_step = lives(run_dir)[-1]
                while max(s3.complete_steps(run_id) + [0]) <= start_step:
                    assert time.monotonic() < deadline and proc.poll() is None, f"trial {trial}: no upload"
                    time.sleep(0.05)
            # Even trials wait for a save in flight, odd ones for a save or an upload.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not (
                any(in_flight(ckpts)) if lost else in_flight(ckpts)[0]
            ):
                assert proc.poll() is None, f"trial {trial}: the run ended before the kill"
                time.sleep(0.002)
            for pid in children(proc.pid) + [proc.pid]:
                os.kill(pid, signal.SIGKILL)
            proc.wait(30)
            saving, uploading = in_flight(ckpts)
            saves += saving
            uploads += uploading
            local = list_steps(ckpts)
            remote = s3.complete_steps(run_id)
            if lost:
                shutil.rmtree(ckpts, ignore_errors=True)
                local = []
            expected.append(max(local + remote + [0]))
            report.append(
                (trial, lives(run_dir)[-1], "save" if saving else "upload" if uploading else "-", lost)
            )
        final = start(run_dir, s3)
        assert final.wait(300) == 0, (run_dir / "logs" / "rank0.log").read_text()[-3000:]
    finally:
        s3.stop()
    got = lives(run_dir)
    print(
        f"\nSIGKILL trials: {trials} ({saves} with a save in flight, {uploads} with an upload in flight, "
        f"{trials // 2} losing the node-local tier); resumed from {got[1:]}; "
        f"{time.monotonic() - t_start:.0f} s in all"
    )
    for row in report:
        print("  trial {}: life started at step {}, killed during {}, local tier lost: {}".format(*row))
    assert got == expected, (got, expected)
    from_s3 = [got[t + 1] for t in range(1, trials, 2)]
    assert all(step > 0 for step in from_s3), from_s3  # every disk loss resumed from S3
    assert saves + uploads >= trials * 3 // 4, (saves, uploads)
    each = 3 if trials >= 20 else 2  # odd trials kill at whichever is in flight first
    assert saves >= each and uploads >= each, (saves, uploads)
    again = losses(run_dir)  # also checks every re-run step against its first run
    assert sorted(again) == list(range(1, STEPS + 1))
    bad = [(s, again[s], ref_losses[s]) for s in again if abs(again[s] - ref_losses[s]) > 1e-6]
    assert not bad, bad
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and abs(result["final_loss"] - ref_losses[STEPS]) <= 1e-6
