"""A first Slurm submission with a preset's size fits the default QOS share
(launcher/fit.py): every preset, on a cluster of its own size, plans a request
within qos=research's share; a size the user types is kept as typed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.compose import CONF_DIR, compose
from launcher.plan.fit import fit_to_qos_share, gpu_share
from launcher.plan.make import make_plan

SLURM_PRESETS = sorted(
    p.stem for p in Path(CONF_DIR, "cluster").glob("*.yaml") if "kind: slurm" in p.read_text()
)
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("preset", SLURM_PRESETS)
def test_each_preset_with_default_qos_fits_its_own_cluster(preset: str) -> None:
    cfg = compose([f"cluster={preset}"])
    node_gpus = cfg.cluster.gpus_per_node
    total = cfg.cluster.nodes * node_gpus  # the preset's cluster
    share = gpu_share(cfg.qos, total)
    assert cfg.qos.name == "research" and total > share  # every preset is over the share as written
    note = fit_to_qos_share(cfg, [f"cluster={preset}"])
    assert note and f"may hold {share} of this {total}-GPU" in note
    plan = make_plan(cfg)
    # Exclusive nodes count every GPU of the node (what Slurm's GrpTRES counts).
    asked = plan.nodes * (node_gpus if cfg.launcher.exclusive else cfg.cluster.gpus_per_node)
    assert 0 < asked <= share, (preset, plan.nodes, cfg.cluster.gpus_per_node, cfg.launcher.exclusive)
    assert plan.world_size == plan.nodes * plan.ranks_per_node


def test_typed_size_is_kept() -> None:
    for over in (["cluster=4node", "cluster.nodes=4"], ["cluster=4node", "++cluster.gpus_per_node=8"]):
        cfg = compose(over)
        assert fit_to_qos_share(cfg, over) is None
        assert (cfg.cluster.nodes, cfg.cluster.gpus_per_node) == (4, 8)
    # A share that allows the whole request changes nothing.
    cfg = compose(["cluster=4node", "qos=training", "qos.cluster_share_pct=100"])
    assert fit_to_qos_share(cfg, []) is None and cfg.cluster.nodes == 4
    # Local runs are never resized.
    cfg = compose([])
    assert fit_to_qos_share(cfg, []) is None


def test_cli_dry_run_shows_the_fitted_request(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "launcher", "cluster=4node", "model=13b", "launcher.dry_run=true"]
        + [f"launcher.run_dir={tmp_path / 'r'}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "qos=research may hold 12 of this 32-GPU cluster's GPUs" in p.stdout
    assert "#SBATCH --nodes=1\n" in p.stdout and "#SBATCH --gpus-per-node=8\n" in p.stdout


@pytest.mark.slurm
def test_live_cluster_accepts_the_fitted_first_request() -> None:
    """qos_admin check asks the live test cluster (sacctmgr, partitions) about
    the request that `python -m launcher cluster=testcluster` makes."""
    import os

    from testcluster_util import require_test_cluster

    env = dict(os.environ, SLURM_CONF=require_test_cluster())
    ok = subprocess.run(
        [sys.executable, "-m", "launcher.qos_admin", "check", "cluster=testcluster"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "asking for 1 node x 8 GPUs" in ok.stdout and "ok: partition=research" in ok.stdout
    # The size as typed (the whole cluster) is refused by the same check.
    whole = subprocess.run(
        [sys.executable, "-m", "launcher.qos_admin", "check", "cluster=testcluster", "cluster.nodes=4"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert whole.returncode == 2 and "over QOS research's share of 12 GPUs" in whole.stderr
