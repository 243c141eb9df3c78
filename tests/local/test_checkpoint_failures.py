"""Loud saves through the real trainer (``python -m launcher``, 2 local
ranks): a save that fails is never reported as saved, each failure is said
with its cause, counted and shown by ``meshrun status``, and after
``storage.max_failed_saves`` (default 2) failures in a row the run stops with
an error and a non-zero exit instead of training on unprotected.

The failures are real, made by the kernel: a file-size limit
(``RLIMIT_FSIZE``, inherited by the ranks and their checkpoint workers) below
the staging arena (its shared-memory segment cannot be sized: staging fails
in the trainer), or above the arena but below the shard files the worker
writes (DCP's write fails in the worker: the commit fails on every rank).
A model of many small tensors (16 layers at width 16) keeps the two far
apart: ~280 KB of staged tensors a rank, shard files of ~1 MB and more.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

from harness import launch_in

REPO = Path(__file__).resolve().parents[2]
SMALL_TENSORS = ("model.dim=16", "model.n_layers=16", "model.ffn_dim=32")


def launch(run_dir: Path, fsize_bytes: int) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_bytes, fsize_bytes))

    return launch_in(
        run_dir,
        # Saves at 20 and 40 fail; a third would be at 60.
        "train.steps=80",
        "train.log_every_steps=1",
        "storage.save_every_steps=20",
        *SMALL_TENSORS,
        preexec_fn=limit,
    )


def events(run_dir: Path, name: str) -> list[dict]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r.get("event") == name]


def check_stopped_after_two(run_dir: Path, out: subprocess.CompletedProcess[str], cause: str) -> None:
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    failed = events(run_dir, "checkpoint_failed")
    assert [e["step"] for e in failed] == [20, 40], text[-3000:]
    assert [e["failed_in_a_row"] for e in failed] == [1, 2]
    for e in failed:
        assert cause in e["error"] and "File too large" in e["error"], e
    assert events(run_dir, "checkpoint_committed") == []
    # Nothing was reported as saved, and no step directory holds a commit.
    assert "committed to" not in text and "checkpoint saved" not in text
    assert not list((run_dir / "checkpoints").glob("step_*/manifest.json"))
    assert "checkpoint of step 20 FAILED, not committed (1 in a row; the run stops at 2)" in text
    # The run stopped with the reason as soon as the second failure was
    # known (every rank at the same step), not at the third save, not at the end.
    trained = [r["step"] for r in (json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines())
               if "loss" in r]  # fmt: skip
    assert 40 <= max(trained) < 60, max(trained)
    assert json.loads((run_dir / "result.json").read_text())["status"] == "failed"
    why = "2 checkpoint saves failed in a row (storage.max_failed_saves=2); stopping"
    assert why in out.stderr, out.stderr[-3000:]
    failures = (run_dir / "failures.log").read_text()
    assert why in failures and "Last failure (step 40)" in failures, failures
    status = json.loads((run_dir / "checkpoint_status.json").read_text())
    assert status["failed_saves"] == 2 and status["failed_in_a_row"] == 2, status
    assert status["committed_step"] is None and status["last_failure"]["step"] == 40, status
    shown = subprocess.run(
        [sys.executable, "-m", "launcher.status", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert shown.returncode == 0, shown.stderr
    assert "2 checkpoint save(s) FAILED (2 in a row, the run stops at 2)" in shown.stdout, shown.stdout
    assert "newest committed step in this run: none" in shown.stdout


def test_staging_failure_is_counted_and_stops_the_run(tmp_path: Path) -> None:
    """Files may not grow past 128 KiB: the staging arena (~280 KB a rank)
    cannot be made, on either rank."""
    run_dir = tmp_path / "staging"
    out = launch(run_dir, 128 << 10)
    check_stopped_after_two(run_dir, out, "staging failed")


def test_worker_commit_failure_is_counted_and_stops_the_run(tmp_path: Path) -> None:
    """Files may not grow past 512 KiB: staging works, the workers' shard
    files (~1 MB and more) cannot be written; every rank's commit fails."""
    run_dir = tmp_path / "commit"
    out = launch(run_dir, 512 << 10)
    check_stopped_after_two(run_dir, out, "not committed")
    failed = events(run_dir, "checkpoint_failed")
    assert all("staging" not in e["error"] for e in failed), failed


def test_preemption_whose_final_save_fails_exits_uncommitted(tmp_path: Path) -> None:
    """USR2 (a preemption), and the final save cannot be staged: the run
    says the checkpoint did NOT commit and exits with UNCOMMITTED_EXIT_CODE
    (76, not 75: the batch script says the work since the newest commit is
    lost); result.json says preempted."""
    import signal
    import time

    from launcher.config.runfiles import REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE
    from launcher.config.schema import RunConfig
    from launcher.config.spec import RunSpec, save_spec
    from launcher.plan.make import make_plan
    from launcher.run.local import free_port, rank_env

    cfg = RunConfig()
    cfg.train.steps, cfg.train.log_every_steps = 2000, 1
    cfg.storage.save_every_steps = 100_000  # only the save at the signal
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path))
    save_spec(spec)
    port = free_port()

    def limit() -> None:  # below the staging arena of the tiny model (~0.6 MB a rank)
        resource.setrlimit(resource.RLIMIT_FSIZE, (128 << 10, 128 << 10))

    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "train", str(tmp_path)],
            env=rank_env(spec, r, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=limit,
        )
        for r in range(2)
    ]
    try:
        metrics = tmp_path / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 3):
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGUSR2)
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = [p.returncode for p in procs]
    assert codes == [UNCOMMITTED_EXIT_CODE] * 2 != [REQUEUE_EXIT_CODE] * 2, (codes, outs[0][-3000:])
    result = json.loads((tmp_path / "result.json").read_text())
    stopped = result["final_step"]
    assert result["status"] == "preempted", result
    assert f"checkpoint of step {stopped} NOT committed" in outs[0], outs[0][-3000:]
    assert "staging failed" in outs[0] and f"exit {UNCOMMITTED_EXIT_CODE}" in outs[0]
    assert [e["step"] for e in events(tmp_path, "checkpoint_failed")] == [stopped]
    assert not list((tmp_path / "checkpoints").glob("step_*/manifest.json"))


def test_a_directory_leader_whose_manifest_write_fails_is_not_outvoted(tmp_path: Path) -> None:
    """Two "nodes" (one rank each, each its own tier-1 directory): at a
    preemption, rank 1's manifest write fails (ENOSPC, injected by
    tests/faultinject) while rank 0's directory commits. The run says the
    checkpoint did NOT commit and exits 76 on both ranks, not 75 (the old
    MAX over ranks let rank 0 outvote the failure)."""
    import os
    import signal
    import time

    from launcher.config.runfiles import UNCOMMITTED_EXIT_CODE
    from launcher.config.schema import RunConfig
    from launcher.config.spec import RunSpec, save_spec
    from launcher.plan.make import make_plan
    from launcher.run.local import free_port

    cfg = RunConfig()
    cfg.train.steps, cfg.train.log_every_steps = 2000, 1
    cfg.storage.save_every_steps = 100_000  # only the save at the signal
    cfg.storage.local_dir = f"{tmp_path}/nvme/node$GROUP_RANK"  # one tier-1 directory per "node"
    # Time for the commit after the signal on a busy machine (the workers may still be starting).
    cfg.launcher.signal_lead_s = cfg.qos.grace_time_s = 300
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path / "run"))
    save_spec(spec)
    port = free_port()
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(r))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        env.update(PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests" / "faultinject")]))
        env["MESHRUN_TEST_FAIL_MANIFEST_RANK"] = "1"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "train", spec.run_dir],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=REPO,
            )
        )
    try:
        metrics = Path(spec.run_dir) / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 3):
            time.sleep(0.2)
        for p in procs:  # Slurm signals every task
            p.send_signal(signal.SIGUSR2)
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = [p.returncode for p in procs]
    assert codes == [UNCOMMITTED_EXIT_CODE] * 2, (codes, outs[0][-3000:], outs[1][-3000:])
    stopped = json.loads((Path(spec.run_dir) / "result.json").read_text())["final_step"]
    said = f"--- rank 0\n{outs[0][-3000:]}\n--- rank 1\n{outs[1][-3000:]}"
    # Rank 0's directory did commit; rank 1's did not: the step is not a checkpoint.
    assert (tmp_path / "nvme" / "node0" / spec.run_id / f"step_{stopped}" / "manifest.json").exists(), said
    assert not (tmp_path / "nvme" / "node1" / spec.run_id / f"step_{stopped}" / "manifest.json").exists()
    assert f"checkpoint of step {stopped} NOT committed (rank 1's commit failed" in outs[0], outs[0][-3000:]
    assert (
        f"exit {UNCOMMITTED_EXIT_CODE}" in outs[0] and "committed; the batch script requeues" not in outs[0]
    )
    assert "rank 1: the final checkpoint did not commit" in outs[1] and "No space left" in outs[1], outs[1][
        -3000:
    ]
