"""The local Slurm test cluster (scripts/testcluster.sh) for the tests that
submit to it: where its slurm.conf and its container image are, the overrides
that run a job in that image, and a skip that says how to start it
when it is not up (under CI=true, tests/conftest.py turns that skip into a
failure, so a missing cluster cannot pass silently)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CLUSTER_DIR = os.environ.get("MESHRUN_TESTCLUSTER_DIR", "/tmp/meshrun-testcluster")
SLURM_CONF = os.path.join(CLUSTER_DIR, "etc", "slurm.conf")
IMAGE = os.path.join(CLUSTER_DIR, "images", "meshrun-test.sqsh")
IN_IMAGE_PYTHON = "/opt/meshrun-test/python"


def require_test_cluster() -> str:
    """SLURM_CONF of the running test cluster, or skip naming the command that starts it."""
    if not os.path.exists(SLURM_CONF):
        pytest.skip("local Slurm test cluster not started (scripts/testcluster.sh start)")
    env = {**os.environ, "SLURM_CONF": SLURM_CONF}
    if subprocess.run(["scontrol", "ping"], env=env, capture_output=True, timeout=30).returncode:
        pytest.skip("local Slurm test cluster not running (scripts/testcluster.sh start)")
    return SLURM_CONF


def host_python_mounts() -> list[str]:
    """The host's /usr and this interpreter's prefixes, read-only."""
    prefixes = sorted({sys.base_prefix, sys.prefix})
    return ["/usr:/usr:ro", *[f"{p}:{p}:ro" for p in prefixes if p != "/usr" and not p.startswith("/usr/")]]


def container_overrides(image: str = IMAGE) -> list[str]:
    """Run the job's ranks in ``image`` through Pyxis, with the host's Python mounted."""
    mounts = ",".join(f"'{m}'" for m in host_python_mounts())
    return [
        "cluster.pyxis=true",
        f"cluster.container_image={image}",
        f"cluster.container_python={IN_IMAGE_PYTHON}",
        f"cluster.container_mounts=[{mounts}]",
        f"+cluster.env.MESHRUN_TEST_PYTHON={sys.executable}",
    ]
