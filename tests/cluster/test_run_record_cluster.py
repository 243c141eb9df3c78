"""Issue 51 on the real test cluster (scripts/testcluster.sh): one run, one
record. A plain DDP program (job=script) has a task SIGKILLed and restarted
inside its job, then is extended by a second job in the same run dir
(``python -m launcher launcher.run_dir=DIR`` with more steps). At the end
``meshrun status``, ``meshrun fleet --json``, the page's JSON, the API
handle and goodput.json agree on state, last step, restarts, faults,
redone steps and GPU-seconds, and the GPU-seconds are sacct's over both
jobs (within 2%). The units: tests/unit/test_run_record.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import REPO, heartbeat_at, job_id_from, launch_in, launch_toy, wait_job

from launcher.slurm.cluster import accounting
from launcher.views.goodput import attempts_from

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


def _status_row(run_dir: Path) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "launcher.status", str(run_dir)],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    head, row = (re.split(r"\s{2,}", line.strip()) for line in out.stdout.splitlines()[:2])
    return dict(zip(head, row, strict=True))


def _fleet_json(root: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "launcher.fleet", str(root), "--json"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)["runs"][0]


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
    record = json.loads((run_dir / "slurm" / "job.json").read_text())
    assert [j["job_id"] for j in record["jobs"]] == [first, second], record

    status = _status_row(run_dir)
    fleet = _fleet_json(root)
    from launcher.views.fleetrows import collect
    from launcher.views.fleetweb import answer

    body, _, _ = answer(collect(root, write=False), "/api/fleet.json")
    page = json.loads(body)["runs"][0]
    from launcher.api import Run

    api = Run(str(run_dir), second).status()
    assert api.summary is not None
    g = json.loads((run_dir / "goodput.json").read_text())

    # State and last step.
    assert status["STATE"] == fleet["state"] == page["state"] == api.state == g["state"] == "COMPLETED"
    assert status["STEP"] == "20/20" and fleet["step"] == page["step"] == api.summary.last_step == 20
    # Restarts: the SIGKILL's restart inside the first job and the extension's start.
    restarts = g["restarts"]
    assert restarts >= 2 and (status["RESTARTS"], fleet["restarts"], page["restarts"], api.restarts) == (
        str(restarts),
        restarts,
        restarts,
        str(restarts),
    ), (status, g)
    faults = g["failures"]
    assert faults >= 1 and (status["FAULTS"], fleet["faults"], page["faults"], api.faults) == (
        str(faults),
        faults,
        faults,
        str(faults),
    )
    redone = g["steps"]["redone"]
    assert (status["REDONE"], fleet["redone"], page["redone"], api.redone) == (
        str(redone),
        redone,
        redone,
        str(redone),
    )
    # GPU-seconds: every job of the run, as sacct bills them (Start..End x GPUs).
    by_job = attempts_from(accounting([first, second]))
    billed = sum((a.end - a.start) * a.gpus for j in (first, second) for a in by_job[j] if a.start and a.end)
    gpu_s = g["allocated_gpu_s"]
    assert billed > 0 and abs(gpu_s - billed) <= 0.02 * billed, (gpu_s, billed)
    assert fleet["gpu_hours"] * 3600 == pytest.approx(gpu_s, rel=1e-6)
    assert page["gpu_hours"] * 3600 == pytest.approx(gpu_s, rel=1e-6)
    assert api.summary.gpu_s == pytest.approx(gpu_s, rel=1e-6)
    assert float(status["GPU-H"]) == pytest.approx(gpu_s / 3600, abs=6e-4)
    # The program, not a model; no tokens or cost it cannot know.
    assert status["PROGRAM"].startswith("ddp_toy.py") and fleet["model"] == "" and fleet["tokens"] is None
    print(
        f"run record: jobs {first}, {second}; restarts {restarts}, faults {faults}, redone {redone}, "
        f"{gpu_s:.0f} GPU-s (sacct {billed:.0f}); {time.monotonic() - t0:.0f} s wall"
    )
