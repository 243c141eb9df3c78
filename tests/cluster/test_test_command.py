"""The one test command (scripts/test.sh): what it decides on this machine
(setup, the test cluster, the one line of what cannot run), in its dry mode,
and one real run on a tiny subset that leaves the running shared test
cluster as it found it. CI (.ci/run) calls exactly this command."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from testcluster_util import require_test_cluster

ROOT = Path(__file__).resolve().parents[2]


def run_test_sh(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MESHRUN_TEST_")}
    full.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        ["bash", "scripts/test.sh", *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=300
    )


def one_cannot_line(out: str) -> str:
    lines = [line for line in out.splitlines() if "cannot run here" in line or "every test can run" in line]
    assert len(lines) == 1, out
    return lines[0]


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


def test_dry_run_starts_a_stopped_cluster_and_stops_only_that(tmp_path: Path) -> None:
    p = run_test_sh(
        MESHRUN_TEST_DRY="1", MESHRUN_TEST_SETUP="0", MESHRUN_TESTCLUSTER_DIR=str(tmp_path / "tc")
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "setup skipped (MESHRUN_TEST_SETUP=0)" in out
    if os.geteuid() == 0:
        assert "would run: scripts/testcluster.sh start" in out
        assert "would stop the test cluster at exit (started here)" in out
    else:
        assert "Slurm test cluster tests (its daemons run as root" in one_cannot_line(out)
    assert not (tmp_path / "tc").exists()  # dry: nothing made


@pytest.mark.slurm
def test_a_real_run_of_a_subset_leaves_the_shared_cluster_running() -> None:
    conf = require_test_cluster()
    p = run_test_sh(
        "tests/local/test_docs.py", "-k", "readme", "-p", "no:cacheprovider", MESHRUN_TEST_SETUP="0"
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"\b1 passed\b", p.stdout), p.stdout
    assert "test cluster already running" in p.stdout and "slowest" in p.stdout
    ping = subprocess.run(["scontrol", "ping"], env={**os.environ, "SLURM_CONF": conf}, capture_output=True)
    assert ping.returncode == 0, "scripts/test.sh stopped a cluster it did not start"


def test_ci_runs_exactly_the_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    runs = [line for line in ci.splitlines() if "pytest" in line and not line.lstrip().startswith("#")]
    assert runs == [], runs  # pytest only through scripts/test.sh
    assert "bash scripts/test.sh || rc=$?" in ci and "export CI=true" in ci
    assert "ruff check . && ruff format --check ." in ci and "policy-rc.d" in ci
