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
import time
from pathlib import Path

import pytest
from harness import heartbeat_at, launch_toy, resumed_beat, wait_job
from thirdparty_util import buckets_cover_allocation, fleet_lists_script

# Opt-in (pytest -m campaign): in CI two programs no one here wrote meet the
# same faults on the cluster, with more checks (tests/cluster/test_thirdparty_trl_cluster.py:
# SIGKILL, preemption, hang; tests/cluster/test_thirdparty_lightning_cluster.py: SIGKILL,
# time limit, preemption, hang). This toy keeps its figures comparable across stops.
pytestmark = [pytest.mark.slurm, pytest.mark.campaign, pytest.mark.usefixtures("slurm_env")]
STEPS = 16


def submit(run_dir: Path, root: Path, *extra: str, steps: int = STEPS) -> str:
    out = launch_toy(
        f"job.args=[--steps,{steps},--save-every,4,--sleep,0.3]",
        "cluster=testcluster",
        "cluster.nodes=2",
        "cluster.gpus_per_node=2",
        "cluster.spare_nodes=1",
        "launcher.exclusive=false",
        "qos.time_limit_min=5",
        "launcher.signal_lead_s=30",
        "launcher.hang_startup_timeout_s=150",
        f"launcher.runs_root={root}",
        *extra,
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


def test_plain_ddp_program_preempted_then_hung_resumes_each_time_and_completes(tmp_path: Path) -> None:
    """One job, two faults, as a foreign program meets them: preempted by a
    training-QOS job (SIGTERM: the program saves and exits, the job requeues
    and the program resumes from its own checkpoint), then in the second
    allocation one program SIGSTOPped: the hang is found from its step lines
    alone (the wrapper stays alive), the stopped node is blamed and the
    program restarts on the spare from its checkpoint. The fleet lists it."""
    steps = 60
    run_dir = tmp_path / "run"
    job = submit(run_dir, tmp_path, "qos.time_limit_min=8", "launcher.hang_timeout_s=10", steps=steps)
    h0 = heartbeat_at(run_dir, 0, 5)
    preempted_at = time.time()
    subprocess.run(
        ["sbatch", "--parsable", "-N1", "-w", h0["node"], "-p", "training", "-q", "training", "-A", "training",
         "-t", "1", "--mem=200G", "-o", "/dev/null", "--wrap", "sleep 2"],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    h = resumed_beat(run_dir, 3, 1, 3, 300)  # the second allocation's rank 3, resumed
    resumed_after_preempt = h["first_step_at"] - preempted_at
    child = subprocess.run(["pgrep", "-P", str(h["pid"])], capture_output=True, text=True).stdout.split()
    assert len(child) == 1, child
    os.kill(int(child[0]), signal.SIGSTOP)
    state = wait_job(job, 300)["state"]
    err = (run_dir / "slurm" / f"{job}_0_log.err").read_text()
    assert state == "COMPLETED", err[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["final_step"] == steps, result
    fs = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    hang = [f for f in fs if f.get("cause") == "hang" and "event" not in f]
    assert len(hang) == 1 and hang[0]["action"] == "restart" and hang[0]["node"] == h["node"], fs
    assert 3 in hang[0]["evidence"]["unresponsive_ranks"], hang
    resumed = [f for f in fs if f.get("event") == "resumed"]
    assert resumed and resumed[-1]["job"] == job and resumed[-1]["cause"] == "hang", fs
    logs = (run_dir / "logs" / "rank0.log").read_text()
    assert logs.count("resumed from step ") >= 2, logs[-2000:]  # after the requeue, after the hang
    good = json.loads((run_dir / "goodput.json").read_text())
    assert good["final"] and good["requeues"]["preemptions"] == 1 and good["restarts"] == 2, good
    buckets_cover_allocation(good)
    fleet_lists_script(tmp_path, job)
    steps_logged = [
        json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"step"' in x
    ]
    drop = next(i for i in range(1, len(steps_logged)) if steps_logged[i] <= steps_logged[i - 1])
    print(
        f"\njob=script preempted: {resumed_after_preempt:.0f} s from the preemptor's submission to the first "
        f"resumed step, {steps_logged[drop - 1] - steps_logged[drop] + 1} steps redone; hang: detected {resumed[-1].get('detect_s')} s after the last step line, "
        f"{resumed[-1].get('seconds_lost')} s to the first resumed step, {resumed[-1].get('steps_redone')} "
        "steps redone"
    )
