"""The one test command (scripts/test.sh) in its dry mode with the test cluster
stopped: it would start it and stop only what it started (the rest:
tests/unit/test_test_command_ci.py, tests/cluster/test_test_command.py)."""

from __future__ import annotations

import os
from pathlib import Path

from harness import one_cannot_line, run_test_sh


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
        # No arguments: the cluster tier in its own pytest beside the others.
        assert out.rstrip().endswith(
            "would run: python -m pytest -q tests/cluster, beside python -m pytest -q tests/unit tests/local"
        ), out
    else:
        assert "Slurm test cluster tests (its daemons run as root" in one_cannot_line(out)
    assert not (tmp_path / "tc").exists()  # dry: nothing made
