"""A foreign program's lifecycle on the real test cluster (scripts/testcluster.sh):
one job of a self-chaining program proves that its own ``scontrol requeue``
with no stop under way reaches Slurm (meshrun's shim answered it, and the job
COMPLETED after the first slice), and that its own exit 75 (EX_TEMPFAIL)
is a failure counted against ``launcher.max_restarts`` (it was read as a stop
and requeued forever, uncounted). The wrapper's and the supervisor's units:
tests/local/test_script_lifecycle.py, tests/unit/test_script_lifecycle_units.py."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
from harness import events, job_id_from, launch, wait_job

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
    # (Slurm's requeue also SIGTERMs the slice it ends: the first exit may read as stopped.)
    exits = [(e["rc"], e["stopped"]) for e in events(run_dir, "program_exit")]
    assert [rc for rc, _ in exits] == [0, 75] and not exits[1][1], logs[-4000:]
    assert "slice 1: step 2" in logs and "is not run" not in logs
    # Its own 75 was a failure, counted: max_restarts=1 was used by its requeue, so the run gave up.
    assert state == "FAILED", logs[-4000:]
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    assert [f.get("action") for f in faults if "cause" in f] == ["give up"], faults
    assert "(program exit 75 (meshrun's stop code, with no stop under way))" in faults[-1]["error"], faults
    assert not (run_dir / "requeues.log").exists() or not (run_dir / "requeues.log").read_text().strip()
    assert json.loads((run_dir / "result.json").read_text())["error"] == "exit 75"
    print(f"self-chaining job {job}: {state} in {time.monotonic() - t0:.0f} s")
