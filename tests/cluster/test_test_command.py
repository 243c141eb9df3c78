"""The one test command (scripts/test.sh): what it decides on this machine
(setup, the test cluster, the one line of what cannot run), in its dry mode,
and one real run on a tiny subset that leaves the running shared test
cluster as it found it (the dry run with a stopped cluster:
tests/local/test_test_command_dry.py). CI (.ci/run) calls exactly this
command (tests/unit/test_test_command_ci.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from harness import one_cannot_line, run_test_sh
from testcluster_util import require_test_cluster


@pytest.mark.slurm
def test_dry_run_uses_a_running_cluster_as_it_is() -> None:
    require_test_cluster()
    p = run_test_sh("-k", "walkthrough", MESHRUN_TEST_DRY="1")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    root_apt = os.geteuid() == 0 and shutil.which("apt-get")
    setup = "bash scripts/setup.sh --test-cluster" if root_apt else "bash scripts/setup.sh"
    assert f"meshrun test: would run: {setup}\n" in out, out
    assert "test cluster already running: using it as it is (left running at exit)" in out
    assert "testcluster.sh start" not in out and "stop" not in out
    assert out.rstrip().endswith("would run: python -m pytest -q -k walkthrough"), out
    one_cannot_line(out)


@pytest.mark.slurm
def test_a_real_run_of_a_subset_leaves_the_shared_cluster_running() -> None:
    conf = require_test_cluster()
    p = run_test_sh(
        "tests/unit/test_docs_units.py", "-k", "readme", "-p", "no:cacheprovider", MESHRUN_TEST_SETUP="0"
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"\b1 passed\b", p.stdout), p.stdout
    assert "test cluster already running" in p.stdout and "slowest" in p.stdout
    ping = subprocess.run(["scontrol", "ping"], env={**os.environ, "SLURM_CONF": conf}, capture_output=True)
    assert ping.returncode == 0, "scripts/test.sh stopped a cluster it did not start"
