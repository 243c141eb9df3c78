"""The local Slurm test cluster (scripts/testcluster.sh) for the tests that
submit to it: where its slurm.conf is, and a skip that says how to start it
when it is not up (under CI=true, tests/conftest.py turns that skip into a
failure, so a missing cluster cannot pass silently)."""

from __future__ import annotations

import os
import subprocess

import pytest

CLUSTER_DIR = os.environ.get("MESHRUN_TESTCLUSTER_DIR", "/tmp/meshrun-testcluster")
SLURM_CONF = os.path.join(CLUSTER_DIR, "etc", "slurm.conf")


def require_test_cluster() -> str:
    """SLURM_CONF of the running test cluster, or skip naming the command that starts it."""
    if not os.path.exists(SLURM_CONF):
        pytest.skip("local Slurm test cluster not started (scripts/testcluster.sh start)")
    env = {**os.environ, "SLURM_CONF": SLURM_CONF}
    if subprocess.run(["scontrol", "ping"], env=env, capture_output=True, timeout=30).returncode:
        pytest.skip("local Slurm test cluster not running (scripts/testcluster.sh start)")
    return SLURM_CONF
