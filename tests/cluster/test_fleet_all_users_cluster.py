"""``meshrun fleet --all-users`` on the test cluster: one real meshrun job
submitted under root A shows from an empty root B, by what Slurm knows, with
one sacct and one squeue (recorded answers: tests/unit/test_fleet_all_users.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slurm
def test_all_users_on_the_test_cluster(tmp_path: Path) -> None:
    """One real meshrun job submitted under root A shows in --all-users from
    an empty root B, by what Slurm knows, with one sacct and one squeue."""
    from testcluster_util import require_test_cluster

    env = {**os.environ, "SLURM_CONF": require_test_cluster()}
    out = subprocess.run(
        [sys.executable, "-m", "launcher", "cluster=testcluster", "model=tiny", "launcher.exclusive=false",
         "cluster.nodes=1", "cluster.gpus_per_node=2", "train.steps=3", "qos.time_limit_min=3",
         "launcher.mem_gb=1", f"launcher.run_dir={tmp_path / 'a' / 'run'}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    job = json.loads((tmp_path / "a" / "run" / "slurm" / "job.json").read_text())["job_id"]
    try:
        (tmp_path / "b").mkdir()
        out = subprocess.run(
            [sys.executable, "-m", "launcher.cli", "fleet", str(tmp_path / "b"), "--all-users", "--json"],
            capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        view = json.loads(out.stdout)
        assert view["runs"] == [] and view["scheduler_calls"] == 2
        (row,) = [r for r in view["others"] if r["job_id"] == job]
        assert row["run_dir"] == str(tmp_path / "a" / "run") and row["run"].startswith("tiny-testcluster-")
        assert row["qos"] == "research" and row["partition"] and row["user"] and row["gpus"] == 2, row
        assert row["state"] in ("PENDING", "RUNNING", "COMPLETED", "COMPLETING"), row
        # Under its own root it is a run, not an "other" job.
        out = subprocess.run(
            [sys.executable, "-m", "launcher.cli", "fleet", str(tmp_path / "a"), "--all-users", "--json"],
            capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
        )  # fmt: skip
        view = json.loads(out.stdout)
        assert [r["job_id"] for r in view["runs"]] == [job] and job not in {
            r["job_id"] for r in view["others"]
        }
    finally:
        subprocess.run(["scancel", job], env=env, timeout=30, check=False)
