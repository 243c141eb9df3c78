"""A training program no one here wrote, from the package index, in its own
virtualenv, through ``python -m launcher job=script`` on the real test
cluster (scripts/testcluster.sh): Hugging Face Accelerate's distributed
test program (``accelerate.test_utils.scripts.test_script``, what
``accelerate test`` runs: process/data-loader/RNG checks and two training
runs that must match single-process training), 2 nodes x 1 task with gloo
on CPU (with 4 CPU processes Accelerate's own split check fails: an empty
shard, torch.Size([0, 4]) against [1, 4], whatever launches it), with the venv's own python (``job.python``) and torch, not
meshrun's. Its program on one rank is SIGKILLed mid-run: the supervisor
blames the node and starts it again on the spare; the program has no
checkpoints, so it runs again from its start, and every check passes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import wait_job
from thirdparty_util import buckets_cover_allocation, fleet_lists_script

# Opt-in (pytest -m campaign), not CI: run as one distributed program on CPU
# (ACCELERATE_USE_CPU, as `accelerate launch --cpu`), Accelerate's
# test_script passes every check and then one rank may abort at exit
# ("terminate called without an active exception": it never destroys its
# process group), so the run fails after its last check on some tries;
# without ACCELERATE_USE_CPU it runs lone processes and proves nothing.
pytestmark = [pytest.mark.slurm, pytest.mark.campaign, pytest.mark.usefixtures("slurm_env")]
MODULE = "accelerate.test_utils.scripts.test_script"
LAST_SECTION = "**Breakpoint trigger test**"  # its checks run in order; this is the last one


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Its own virtualenv: torch and accelerate from the package index."""
    root = tmp_path_factory.mktemp("venv-accelerate")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    py = root / "bin" / "python"
    out = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "torch==2.13.0",
         "accelerate==1.16.0"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return py


def _programs(py: Path) -> list[int]:
    """PIDs of the program's processes (the venv's python running MODULE)."""
    out = subprocess.run(["pgrep", "-f", "--", f"-m {MODULE}"], capture_output=True, text=True).stdout.split()
    pids = []
    for pid in out:
        try:
            if os.readlink(f"/proc/{pid}/exe") == os.path.realpath(py):
                pids.append(int(pid))
        except OSError:
            continue
    return pids


def test_accelerate_program_in_its_own_venv_survives_a_sigkill_and_passes(venv: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    run_dir = tmp_path / "run"
    work = tmp_path / "work"  # an empty workdir: the program is the installed package's
    work.mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "launcher", "job=script", f"job.module={MODULE}", f"job.python={venv}",
         "cluster=testcluster", "cluster.nodes=2", "cluster.gpus_per_node=1", "cluster.spare_nodes=1",
         # What `accelerate launch --cpu` sets: on a host without an accelerator,
         # Accelerate otherwise runs every process alone (DistributedType.NO).
         "+cluster.env.ACCELERATE_USE_CPU=true",
         "launcher.exclusive=false", "qos.time_limit_min=5", "launcher.hang_startup_timeout_s=150",
         f"launcher.runs_root={tmp_path}", f"launcher.run_dir={run_dir}"],
        capture_output=True, text=True, timeout=120, cwd=work,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    job = json.loads((run_dir / "slurm" / "job.json").read_text())["job_id"]
    # Mid-run: once its first check printed, kill one of its 2 processes.
    log = run_dir / "logs" / "rank0.log"
    deadline = time.monotonic() + 180
    while not (log.exists() and "**Initialization**" in log.read_text() and len(_programs(venv)) == 2):
        assert time.monotonic() < deadline, "the program never started on 2 ranks"
        time.sleep(0.05)
    victim = _programs(venv)[-1]
    env = dict(x.split("=", 1) for x in Path(f"/proc/{victim}/environ").read_text().split("\0") if "=" in x)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    while log.read_text().count("**Initialization**") < 2 and time.monotonic() < killed_at + 240:
        time.sleep(0.1)
    again_s = time.monotonic() - killed_at  # the program's first line again, on the spare
    rec = wait_job(job, 300)
    err = (run_dir / "slurm" / f"{job}_0_log.err").read_text()
    assert rec["state"] == "COMPLETED", err[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed", result
    fs = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    fault = fs[0]
    assert fault["action"] == "restart" and fault["srun_exit"] == 128 + signal.SIGKILL, fs
    assert (
        fault["cause"] == "signal"
        and fault["node"] == env["SLURMD_NODENAME"]
        or fault["cause"] == "node_down"
    )
    # Run again from its start (no checkpoints of its own), every check passed on every rank.
    logs = log.read_text()
    assert logs.count("**Initialization**") == 2 and logs.count(LAST_SECTION) >= 1, logs[-2000:]
    assert "Traceback" not in logs.split("**Initialization**")[-1], logs[-3000:]
    # One program of 2 processes (not 2 alone): Accelerate says so in its first check.
    assert "DistributedType.MULTI_CPU" in logs and "Num processes: 2" in logs, logs[:1500]
    good = json.loads((run_dir / "goodput.json").read_text())
    # A program that prints no step: wall-clock goodput from its wrapper's
    # start and exit records (its run time productive, the time between its
    # two starts lost to the restart); the fault counted once, one restart.
    assert good["final"] and good["failures"] == 1 and good["state"] == "COMPLETED", good
    assert good["restarts"] == 1 and good["buckets_s"]["productive"] > 0, good
    assert good["buckets_s"]["hang_restart"] > 0 and 0 < good["ettr"] < 1, good
    buckets_cover_allocation(good)
    fleet_lists_script(tmp_path, job)
    print(
        f"\naccelerate test_script (own venv): SIGKILL of rank {env.get('RANK')} on {fault.get('node')}, "
        f"{again_s:.0f} s from the kill to its first line again (it restarts from its start); "
        f"{time.monotonic() - t0:.0f} s wall"
    )
