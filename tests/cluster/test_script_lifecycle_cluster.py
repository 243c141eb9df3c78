"""A foreign program's lifecycle on the real test cluster (scripts/testcluster.sh):
one job of a self-chaining program proves that its own ``scontrol requeue``
with no stop under way reaches Slurm (meshrun's shim answered it, and the job
COMPLETED after the first slice), and that its own exit 75 (EX_TEMPFAIL)
is a failure counted against ``launcher.max_restarts`` (it was read as a stop
and requeued forever, uncounted); one job whose quiet ranks outlive rank 0's
completed program proves that the teardown rule ends only the silent one,
after the one still writing has finished (both were SIGKILLed at the limit,
losing what was being written), and that result.json says which was ended.
The wrapper's and the supervisor's units: tests/local/test_script_lifecycle.py,
tests/unit/test_script_lifecycle_units.py."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
from harness import events, job_id_from, launch, wait_job

from launcher.config.health import read_heartbeats

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]

# Slice 0 trains, asks Slurm for the next slice and ends; slice 1 meets a
# busy server and exits 75, its own "try again later".
CHAIN = textwrap.dedent(
    """
    import os, subprocess, sys
    n = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    print(f"slice {n}: step {n + 1}", flush=True)
    if n == 0:
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
        sys.exit(0)
    print("RuntimeError: the data server is busy, try again later", flush=True)
    sys.exit(75)
    """
)


def test_own_requeue_reaches_slurm_and_own_exit_75_is_a_counted_failure(tmp_path: Path) -> None:
    t0 = time.monotonic()
    prog = tmp_path / "chain.py"
    prog.write_text(CHAIN)
    run_dir = tmp_path / "run"
    out = launch(
        "job=script",
        f"job.script={prog}",
        f"job.workdir={tmp_path}",
        "cluster=testcluster",
        "cluster.nodes=1",
        "cluster.gpus_per_node=1",
        "launcher.exclusive=false",
        "qos.time_limit_min=5",
        "launcher.signal_lead_s=30",
        "launcher.max_restarts=1",  # the program's own requeue is one of Slurm's restarts
        f"launcher.runs_root={tmp_path}",
        run_dir=run_dir,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    job = job_id_from(out.stdout)
    state = wait_job(job, 300)["state"]
    logs = "".join(p.read_text() for p in sorted((run_dir / "slurm").glob(f"{job}_*_log.*")))
    # Its own requeue ran: a second slice started (the shim answered it: COMPLETED after one).
    # Slurm's requeue also SIGTERMs the slice it ends: the first slice's exit is its own 0,
    # or -15 when that SIGTERM reached it before its sys.exit(0).
    exits = [(e["rc"], e["stopped"]) for e in events(run_dir, "program_exit")]
    assert len(exits) == 2 and exits[0][0] in (0, -15), (exits, logs[-4000:])
    assert exits[1] == (75, False), (exits, logs[-4000:])
    assert "slice 1: step 2" in logs and "is not run" not in logs
    # Its own 75 was a failure, counted: max_restarts=1 was used by its requeue, so the run gave up.
    assert state == "FAILED", logs[-4000:]
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    assert [f.get("action") for f in faults if "cause" in f] == ["give up"], faults
    assert "(program exit 75 (meshrun's stop code, with no stop under way))" in faults[-1]["error"], faults
    assert not (run_dir / "requeues.log").exists() or not (run_dir / "requeues.log").read_text().strip()
    assert json.loads((run_dir / "result.json").read_text())["error"] == "exit 75"
    print(f"self-chaining job {job}: {state} in {time.monotonic() - t0:.0f} s")


# Rank 0 trains and completes; rank 1 (no step reported) writes its shard
# for 25 s after that, far past the 10 s teardown limit; rank 2 (no step
# reported) never exits, as a teardown waiting on rank 0's store.
TEARDOWN = textwrap.dedent(
    """
    import os, sys, time
    rank = int(os.environ["RANK"])
    if rank == 0:
        for step in range(1, 4):
            print(f"step {step} loss 0.5", flush=True)
            time.sleep(1)
        sys.exit(0)
    if rank == 1:
        path = os.path.join(os.environ["MESHRUN_CHECKPOINT_DIR"], "shard1.bin")
        with open(path, "wb") as f:
            for _ in range(250):
                f.write(b"x" * 4096)
                f.flush()
                time.sleep(0.1)
        os.rename(path, path + ".done")
        sys.exit(0)
    time.sleep(3600)
    """
)


def test_teardown_rule_waits_for_a_quiet_rank_still_writing_and_says_what_it_ended(tmp_path: Path) -> None:
    t0 = time.monotonic()
    prog = tmp_path / "teardown.py"
    prog.write_text(TEARDOWN)
    run_dir = tmp_path / "run"
    out = launch(
        "job=script",
        f"job.script={prog}",
        f"job.workdir={tmp_path}",
        "cluster=testcluster",
        "cluster.nodes=1",
        "cluster.gpus_per_node=3",
        "launcher.exclusive=false",
        "qos.time_limit_min=5",
        "launcher.signal_lead_s=30",
        "launcher.hang_timeout_s=10",
        f"launcher.runs_root={tmp_path}",
        run_dir=run_dir,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    job = job_id_from(out.stdout)
    state = wait_job(job, 240)["state"]
    logs = "".join(p.read_text() for p in sorted((run_dir / "slurm").glob(f"{job}_*_log.*")))
    assert state == "COMPLETED", logs[-4000:]
    # Rank 1 finished what it was writing: it was not ended with rank 2.
    assert (run_dir / "checkpoints" / "shard1.bin.done").stat().st_size == 250 * 4096, logs[-4000:]
    assert read_heartbeats(run_dir)[1]["phase"] == "done"
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    ended = [f for f in faults if f.get("action") == "end: completed"]
    assert len(ended) == 1 and ended[0]["node"] is None, faults
    assert "rank(s) [2], which report no step, did not exit" in ended[0]["error"], faults
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["status"], result["final_step"], result["ranks_ended"]) == ("completed", 3, [2]), result
    print(f"teardown job {job}: {state} in {time.monotonic() - t0:.0f} s")
