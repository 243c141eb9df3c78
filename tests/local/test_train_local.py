"""The default local run end to end (2 gloo ranks through launcher.run.local,
the launcher's own path), resume from a checkpoint, and the trainer's
pure-Python pieces."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.schema import RunConfig
from launcher.config.spec import RunSpec, save_spec
from launcher.plan.make import make_plan
from launcher.run.local import run_local

METRIC_KEYS = {
    "step",
    "loss",
    "lr",
    "grad_norm",
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "data_wait_s",
    "data_wait_pct",
    "peak_mem_gb",
    "time",
}


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("default_run")
    cfg = RunConfig()
    # Fails the run at the first host sync on a step that logs nothing
    # (train/observe/hostsync.py): loss, grad norm and the stop vote stay deferred.
    cfg.train.host_sync_check = "raise"
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(run_dir))
    save_spec(spec)
    assert run_local(spec, echo=None) == 0, (run_dir / "logs" / "rank0.log").read_text()[-3000:]
    return run_dir


def test_default_run_trains_and_reports(default_run: Path) -> None:
    steps = [r for r in _records(default_run) if "event" not in r]
    assert steps[0]["step"] == 1 and steps[-1]["step"] == 40
    for r in steps:
        assert set(r) >= METRIC_KEYS, set(r) ^ METRIC_KEYS
        assert math.isfinite(r["loss"]) and r["tokens_per_s"] > 0
        # No read between logging steps; one (loss and grad norm together) on each.
        assert r["host_syncs"] == 0 and r["host_syncs_logging_step"] == 1, r
    # Learnable synthetic data: loss falls well below its start.
    assert steps[-1]["loss"] < steps[0]["loss"] - 1.0, (steps[0]["loss"], steps[-1]["loss"])
    result = json.loads((default_run / "result.json").read_text())
    assert result["status"] == "completed" and result["final_step"] == 40
    assert result["final_loss"] == pytest.approx(steps[-1]["loss"])
    from train.checkpoint import complete_checkpoints

    # Every storage.save_every_steps (25) and at the end.
    assert [s for s, _ in complete_checkpoints(default_run / "checkpoints")] == [25, 40]
    log0 = (default_run / "logs" / "rank0.log").read_text()
    assert "step 40/40 | loss" in log0 and "tok/s" in log0 and "data wait" in log0


def test_resume_continues_bitwise(default_run: Path, tmp_path: Path) -> None:
    """Rerun with the final checkpoint removed: resumes from step 25 and
    reproduces the uninterrupted run's losses exactly. It logs every step:
    the losses and grad norms that the first run (every 5th step, read from
    the device only then) logged are bitwise the same."""
    run_dir = tmp_path / "resumed"
    shutil.copytree(default_run, run_dir, ignore=shutil.ignore_patterns("step_40", "prometheus"))
    spec = respec_with_dir(run_dir)
    spec.cfg.train.log_every_steps, spec.cfg.train.host_sync_check = 1, "count"
    save_spec(spec)
    first = {r["step"]: (r["loss"], r["grad_norm"]) for r in _records(run_dir) if "event" not in r}
    (run_dir / "metrics.jsonl").write_text("")
    assert run_local(spec, echo=None) == 0, (run_dir / "logs" / "rank0.log").read_text()[-3000:]
    recs = _records(run_dir)
    assert recs[0]["event"] == "resume" and recs[0]["step"] == 25
    again = {r["step"]: (r["loss"], r["grad_norm"]) for r in recs if "event" not in r}
    assert sorted(again) == list(range(26, 41))
    assert [s for s in again if s in first] == [30, 35, 40]
    for step, values in again.items():
        if step in first:
            assert values == first[step], (step, values, first[step])
    assert all(r["host_syncs_logging_step"] == 1 for r in recs if "event" not in r)


def respec_with_dir(run_dir: Path) -> RunSpec:
    from launcher.config.spec import load_spec

    spec = dataclasses.replace(load_spec(run_dir), run_dir=str(run_dir))
    save_spec(spec)
    return spec


def test_world_size_mismatch_fails_before_process_group(tmp_path: Path) -> None:
    cfg = RunConfig()
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path))
    save_spec(spec)
    # 3 ranks for a 2-rank plan; no MASTER_PORT: a process group would fail
    # differently (or hang), so the message proves the check came first.
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT",)}
    env.update(RANK="0", WORLD_SIZE="3", LOCAL_RANK="0", LOCAL_WORLD_SIZE="3")
    proc = subprocess.run(
        [sys.executable, "-m", "train", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "does not match the 3 ranks" in proc.stderr and "dp_shard=2" in proc.stderr, proc.stderr


def test_usr2_saves_and_exits_for_requeue_then_resumes(tmp_path: Path) -> None:
    """USR2 to one rank: all ranks agree to stop at the same step boundary,
    save, write result.json "preempted", exit with REQUEUE_EXIT_CODE; a rerun
    resumes from that step and completes."""
    import signal
    import time

    from launcher.config.runfiles import REQUEUE_EXIT_CODE
    from launcher.run.local import free_port, rank_env

    cfg = RunConfig()
    cfg.train.steps, cfg.train.log_every_steps = 2000, 1
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path))
    save_spec(spec)
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "train", str(tmp_path)],
            env=rank_env(spec, r, port),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for r in range(2)
    ]
    try:
        metrics = tmp_path / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 3):
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGUSR2)  # not rank 0: agreement must spread it
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [REQUEUE_EXIT_CODE] * 2, codes
    result = json.loads((tmp_path / "result.json").read_text())
    stopped = result["final_step"]
    assert result["status"] == "preempted" and 3 <= stopped < 2000, result
    from train.checkpoint import complete_checkpoints

    assert stopped in [s for s, _ in complete_checkpoints(tmp_path / "checkpoints")]
    assert any(r.get("event") == "preempted" for r in _records(tmp_path))
    # Rerun, shortened to finish soon after the preempted step.
    from launcher.config.spec import load_spec

    spec = load_spec(tmp_path)
    spec.cfg.train.steps = stopped + 3
    save_spec(spec)
    assert run_local(spec, echo=None) == 0
    resume = [r for r in _records(tmp_path) if r.get("event") == "resume"]
    assert resume and resume[-1]["step"] == stopped
    assert json.loads((tmp_path / "result.json").read_text())["status"] == "completed"
