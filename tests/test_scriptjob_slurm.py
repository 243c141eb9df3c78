"""job=script on the real test cluster (scripts/testcluster.sh): a plain DDP
program (tests/programs/ddp_toy.py: env:// rendezvous, gloo on CPU, its own
checkpoints in $MESHRUN_CHECKPOINT_DIR) through ``python -m launcher``, 2
nodes x 2 tasks and a spare node; its process on one rank is SIGKILLed
mid-run: the supervisor restarts it inside the allocation on the spare, the
program resumes from its own checkpoint and the job completes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_scriptjob import launch_toy  # noqa: E402
from test_selfheal import heartbeat_at, wait_job  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]
STEPS = 16


def submit(run_dir: Path, root: Path) -> str:
    out = launch_toy(
        f"job.args=[--steps,{STEPS},--save-every,4,--sleep,0.3]",
        "cluster=testcluster",
        "cluster.nodes=2",
        "cluster.gpus_per_node=2",
        "cluster.spare_nodes=1",
        "launcher.exclusive=false",
        "qos.time_limit_min=5",
        "launcher.signal_lead_s=30",
        "launcher.hang_startup_timeout_s=150",
        f"launcher.runs_root={root}",
        run_dir=run_dir,
        cwd=root,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return next(
        x.split()[3].rstrip(":") for x in out.stdout.splitlines() if x.startswith("meshrun: submitted job ")
    )


def test_plain_ddp_program_trains_survives_a_sigkill_and_completes(tmp_path: Path) -> None:
    t0 = time.monotonic()
    run_dir = tmp_path / "run"
    job = submit(run_dir, tmp_path)
    h = heartbeat_at(run_dir, 3, 6)
    # The program (the wrapper's child), not the wrapper: as if it crashed.
    child = subprocess.run(["pgrep", "-P", str(h["pid"])], capture_output=True, text=True).stdout.split()
    assert len(child) == 1, child
    os.kill(int(child[0]), signal.SIGKILL)
    state = wait_job(job, 240)["state"]
    err = (run_dir / "slurm" / f"{job}_0_log.err").read_text()
    assert state == "COMPLETED", err[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["final_step"] == STEPS, result
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    fault = faults[0]
    assert fault["action"] == "restart" and fault["srun_exit"] == 128 + signal.SIGKILL, faults
    assert f"{h['node']}: task 3: Killed" in err  # the task died of the program's signal
    # Blamed on the killed task's node, unless the shared test cluster's Slurm
    # saw a node stop responding meanwhile (its state comes first).
    assert fault["cause"] == "signal" and fault["node"] == h["node"] or fault["cause"] == "node_down", faults
    assert not (run_dir / "failures.log").exists() or "SIGKILL" not in (run_dir / "failures.log").read_text()
    resumed = [f for f in faults if f.get("event") == "resumed"]
    assert len(resumed) == 1 and resumed[0]["job"] == job, faults  # inside the same allocation
    # The restart resumed from the program's own checkpoint ($MESHRUN_CHECKPOINT_DIR).
    logs = "".join((run_dir / "slurm" / f"{job}_{t}_log.out").read_text() for t in range(4))
    assert "resumed from step " in logs and (run_dir / "checkpoints" / "last.pt").exists()
    steps = [
        json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"step"' in x
    ]
    assert steps[-1] == STEPS and max(steps) == STEPS
    from launcher.config.health import read_heartbeats

    hb = read_heartbeats(run_dir)[0]
    assert (hb["phase"], hb["step"]) == ("done", STEPS)
    good = json.loads((run_dir / "goodput.json").read_text())
    assert good["final"] is True, good
    print(f"job=script cluster test: {time.monotonic() - t0:.0f} s wall")
