"""A request over the test cluster's real QOS limits (sacctmgr) is refused before
anything is submitted, naming the limit, the request and what to change
(launcher/plan/qosshare.py; the rest: tests/unit/test_fit.py,
tests/local/test_fit_dry_run.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slurm
def test_live_qos_limit_refuses_before_submit(tmp_path: Path) -> None:
    """On the test cluster: its preset is accepted by qos_admin check (real
    sacctmgr, partitions, associations); a request over the research QOS's
    real GrpTRES is refused before submission, naming the limit, and nothing
    is written or submitted; a dry run of it says so and still renders it."""
    from testcluster_util import require_test_cluster

    env = {"SLURM_CONF": require_test_cluster()}
    ok = subprocess.run(
        [sys.executable, "-m", "launcher.qos_admin", "check", "cluster=testcluster"],
        capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, **env), timeout=300,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok: partition=research qos=research" in ok.stdout
    live = subprocess.run(
        ["sacctmgr", "-n", "-P", "show", "qos", "research", "format=GrpTRES"],
        capture_output=True, text=True, env=dict(os.environ, **env), timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    limit = int(live.split("gres/gpu=")[1].split(",")[0])
    nodes = limit // 8 + 1  # whole 8-GPU nodes past the limit
    run_dir = tmp_path / "over"
    over = cli(
        "cluster=testcluster", f"cluster.nodes={nodes}", f"launcher.run_dir={run_dir}", env=env, cwd=tmp_path
    )
    assert over.returncode == 2, over.stdout + over.stderr
    assert (
        f"({nodes} nodes x 8 GPUs = {nodes * 8} GPUs) is over QOS research's limit GrpTRES gres/gpu={limit}"
        in over.stderr
    )
    assert f"set cluster.nodes<={limit // 8}" in over.stderr
    assert "submitted job" not in over.stdout and not run_dir.exists()
    dry = cli(
        "cluster=testcluster", f"cluster.nodes={nodes}", "launcher.dry_run=true", f"launcher.run_dir={run_dir}",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert f"#SBATCH --nodes={nodes}\n" in dry.stdout
    assert f"a submission here would be refused: the request ({nodes} nodes" in dry.stdout
    assert not run_dir.exists()
