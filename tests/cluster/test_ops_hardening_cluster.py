"""The supervisor never starts an attempt after a stop signal and forwards a
stop to an attempt it started (issue 35, items 3 and 6), with a fake srun
under the test cluster's SLURM_CONF (the rest: tests/unit/test_ops_hardening.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# --- items 3 and 6: the supervisor after a fault --------------------------
FAKE_SRUN = """#!/bin/sh
# srun stand-in: attempt x.0 fails on node1; later ones beat and wait for a stop.
echo "start $MESHRUN_ATTEMPT" >> "$LOG"
case "$MESHRUN_ATTEMPT" in *.0)
  echo "srun: error: node1: task 0: Exited with exit code 1" >&2; exit 1;;
esac
trap 'echo "USR2 $MESHRUN_ATTEMPT" >> "$LOG"; kill $!; exit 75' USR2
mkdir -p "$RUN/heartbeats"
printf '{"rank": 0, "attempt": "%s", "node": "node2", "phase": "start", "step": 0, "time": %s}' \\
  "$MESHRUN_ATTEMPT" "$(date +%s)" > "$RUN/heartbeats/rank0.json"
sleep 20 & wait $!
echo "never stopped $MESHRUN_ATTEMPT" >> "$LOG"
"""


def _supervised_run(tmp_path: Path) -> tuple[Path, Path]:
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec, save_spec
    from launcher.plan.make import make_plan

    run = tmp_path / "run"
    cfg = compose(
        ["cluster=testcluster", "model=tiny", "cluster.gpus_per_node=1", f"launcher.runs_root={tmp_path}"]
    )
    save_spec(RunSpec(cfg, make_plan(cfg), str(run)))
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    return run, srun


@pytest.mark.slurm
@pytest.mark.parametrize("stop_at", ["attribution", "start"])
def test_supervisor_never_starts_after_a_stop_and_forwards_one(
    tmp_path: Path, stop_at: str, slurm_env: str
) -> None:
    """Attempt 0 fails on node1; the restart goes to node2. A stop that came
    during attribution: attempt 1 is never started, exit 76 (requeue or end,
    as any stop; no final save). A stop that came as attempt 1 started: its
    tasks get USR2 and save (exit 75). Before: attempt 1 started and trained
    on, never told. The supervisor's own process with a stand-in srun
    (tests/stop_race_supervisor.py: why no real job), Slurm's test cluster
    for the node queries."""
    run, srun = _supervised_run(tmp_path)
    log = tmp_path / "srun.log"
    env = {**os.environ, "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "", "STOP_AT": stop_at}
    env.update(LOG=str(log), RUN=str(run), PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "stop_race_supervisor.py"), str(run), "--", str(srun)],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=ROOT,
    )
    starts = log.read_text().splitlines()
    fault = json.loads((run / "faults.jsonl").read_text().splitlines()[0])
    assert (fault["node"], fault["action"]) == ("node1", "restart"), fault
    if stop_at == "attribution":
        assert out.returncode == 76, (out.returncode, out.stderr[-2000:])
        assert starts == ["start 0.0"], starts
        assert "stop signal SIGUSR2 before attempt 0.1 started: not starting it" in out.stderr
    else:
        assert out.returncode == 75, (out.returncode, out.stderr[-2000:])
        assert starts == ["start 0.0", "start 0.1", "USR2 0.1"], starts
        assert "stop signal SIGTERM: passing USR2 to attempt 0.1" in out.stderr
