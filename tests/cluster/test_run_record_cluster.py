"""Issue 51 on the real test cluster (scripts/testcluster.sh): one run, one
record. A plain DDP program (job=script) has a task SIGKILLed and restarted
inside its job, then is extended by a second job in the same run dir
(``python -m launcher launcher.run_dir=DIR`` with more steps). At the end
``meshrun status``, ``meshrun fleet --json``, the page's JSON, the API
handle and goodput.json agree on state, last step, restarts, faults,
redone steps and GPU-seconds, and the GPU-seconds are sacct's over both
jobs (within 2%). The units: tests/unit/test_run_record.py."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from harness import heartbeat_at, job_id_from, launch_in, launch_toy, wait_job
from runviews import assert_views_agree

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]


def _common(root: Path) -> list[str]:
    return [
        "cluster=testcluster",
        "cluster.nodes=1",
        "cluster.gpus_per_node=2",
        "launcher.exclusive=false",
        "qos.time_limit_min=4",
        "launcher.signal_lead_s=30",
        "launcher.hang_startup_timeout_s=120",
        f"launcher.runs_root={root}",
    ]


def test_status_fleet_page_api_and_goodput_agree_over_a_restart_and_an_extension(tmp_path: Path) -> None:
    t0 = time.monotonic()
    root = tmp_path / "runs"
    run_dir = root / "toy"
    out = launch_toy(
        "job.args=[--save-every,4,--sleep,0.3]", "+cluster.env.DDP_TOY_STEPS=12", *_common(root),
        run_dir=run_dir, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    first = job_id_from(out.stdout)
    h = heartbeat_at(run_dir, 1, 5)
    child = subprocess.run(["pgrep", "-P", str(h["pid"])], capture_output=True, text=True).stdout.split()
    assert len(child) == 1, child
    os.kill(int(child[0]), signal.SIGKILL)  # the program, not its wrapper: as if it crashed
    assert wait_job(first, 180)["state"] == "COMPLETED"
    # Extended: the saved config, more steps (the program's own count, and its total for the views).
    out = launch_in(
        run_dir, "++cluster.env.DDP_TOY_STEPS=20", "job.total_steps=20", cwd=tmp_path, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    second = job_id_from(out.stdout)
    assert second != first and wait_job(second, 180)["state"] == "COMPLETED"
    views = assert_views_agree(run_dir, root, [first, second], state="COMPLETED", step=20)
    status, fleet, g = views["status"], views["fleet"], views["goodput"]
    assert status["STEP"] == "20/20"
    # Restarts: the SIGKILL's restart inside the first job and the extension's start.
    restarts, faults, redone, gpu_s = g["restarts"], g["failures"], g["steps"]["redone"], g["allocated_gpu_s"]
    assert restarts >= 2 and faults >= 1, g
    # The program, not a model; no tokens or cost it cannot know.
    assert status["PROGRAM"].startswith("ddp_toy.py") and fleet["model"] == "" and fleet["tokens"] is None
    print(
        f"run record: jobs {first}, {second}; restarts {restarts}, faults {faults}, redone {redone}, "
        f"{gpu_s:.0f} GPU-s; {time.monotonic() - t0:.0f} s wall"
    )
