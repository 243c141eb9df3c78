"""A Slurm request is what the user asked for (launcher/plan/qosshare.py): no
preset or typed size is shrunk to a QOS share. Where Slurm cannot be asked a
dry run says what the preset's share would be and changes nothing; where it
can, the QOS's real limits (sacctmgr) refuse an over-limit request before
anything is submitted, naming the limit, the request and what to change."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.compose import CONF_DIR, compose
from launcher.plan.make import make_plan
from launcher.plan.qosshare import gpu_share, share_note
from launcher.slurm.cluster import qos_limit_problem
from launcher.slurm.qospresets import load_presets, sacctmgr_commands

SLURM_PRESETS = sorted(
    p.stem for p in Path(CONF_DIR, "cluster").glob("*.yaml") if "kind: slurm" in p.read_text()
)
ROOT = Path(__file__).resolve().parents[2]
NO_SLURM = {"SLURM_CONF": "/nonexistent/slurm.conf"}  # Slurm's commands cannot be asked


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
        timeout=300,
    )


@pytest.mark.parametrize("preset", SLURM_PRESETS)
def test_each_preset_plans_its_own_size(preset: str) -> None:
    cfg = compose([f"cluster={preset}"])
    before = dataclasses.asdict(cfg)
    note = share_note(cfg)
    assert dataclasses.asdict(cfg) == before  # said, never changed
    plan = make_plan(cfg)
    assert (plan.nodes, cfg.cluster.gpus_per_node) == (
        before["cluster"]["nodes"],
        before["cluster"]["gpus_per_node"],
    )
    asked = cfg.cluster.nodes * cfg.cluster.gpus_per_node
    share = gpu_share(cfg.qos, max(cfg.cluster.cluster_nodes, cfg.cluster.nodes) * cfg.cluster.gpus_per_node)
    assert (note is None) == (asked <= share), note
    if note:
        assert f"= {asked} GPUs) is over qos=research's share" in note and "kept as typed" in note


def test_the_testcluster_preset_fits_the_test_clusters_qos() -> None:
    """The GrpTRES scripts/testcluster.sh gives each QOS (qos_admin sacctmgr
    --total-gpus 32) admits the testcluster preset's request as written."""
    cmds = "\n".join(sacctmgr_commands(load_presets(), 32, "u"))
    cfg = compose(["cluster=testcluster"])
    assert share_note(cfg) is None and cfg.cluster.cluster_nodes * cfg.cluster.gpus_per_node == 32
    for qos in ("research", "training"):
        limit = int(cmds.split(f"modify qos {qos} set ")[1].split("GrpTRES=gres/gpu=")[1].split()[0])
        assert qos_limit_problem(qos, {"GrpTRES": f"gres/gpu={limit}"}, cfg.cluster.nodes, 8) is None
        assert cfg.cluster.nodes * 8 <= limit


def test_qos_limits_name_the_limit_the_request_and_the_fix() -> None:
    grp = qos_limit_problem("research", {"GrpTRES": "cpu=64,gres/gpu=12"}, 4, 8)
    assert grp and "(4 nodes x 8 GPUs = 32 GPUs)" in grp and "GrpTRES gres/gpu=12" in grp
    assert "set cluster.nodes<=1" in grp
    user = qos_limit_problem("q", {"GrpTRES": "", "MaxTRESPerUser": "gres/gpu=4"}, 1, 8)
    assert user and "MaxTRESPerUser gres/gpu=4" in user and "cluster.gpus_per_node<=4" in user
    nodes = qos_limit_problem("q", {"MaxTRES": "node=2"}, 3, 1)
    assert nodes and "MaxTRES node=2" in nodes and "cluster.nodes<=2" in nodes
    per_node = qos_limit_problem("q", {"MaxTRESPerNode": "gres/gpu=4"}, 2, 8)
    assert per_node and "MaxTRESPerNode gres/gpu=4" in per_node
    assert qos_limit_problem("q", {"GrpTRES": "gres/gpu=16", "MaxTRES": "node=2"}, 2, 8) is None
    assert qos_limit_problem("normal", {"GrpTRES": "", "MaxTRES": ""}, 64, 8) is None


def test_headline_dry_run_renders_the_request_as_typed(tmp_path: Path) -> None:
    """README's first Slurm command, without a reachable Slurm: 4 nodes, and a
    line that says what the preset's share would be."""
    p = cli(
        "model=13b",
        "cluster=4node",
        "launcher.dry_run=true",
        f"launcher.run_dir={tmp_path / 'r'}",
        env=NO_SLURM,
    )
    assert p.returncode == 0, p.stderr
    assert "#SBATCH --nodes=4\n" in p.stdout and "#SBATCH --gpus-per-node=8\n" in p.stdout
    assert "Slurm could not be asked about this request" in p.stdout
    assert "(4 nodes x 8 GPUs = 32 GPUs) is over qos=research's share of cluster=4node's 32 GPUs" in p.stdout
    assert "cluster.nodes=1 (8 GPUs)" in p.stdout
    assert not (tmp_path / "r").exists()
    # A size that fits says nothing about shares, and is rendered as typed too.
    p = cli(
        "cluster=4node",
        "cluster.nodes=1",
        "launcher.dry_run=true",
        f"launcher.run_dir={tmp_path / 'r'}",
        env=NO_SLURM,
    )
    assert p.returncode == 0 and "#SBATCH --nodes=1\n" in p.stdout and "share" not in p.stdout, p.stdout


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
