"""A Slurm request is what the user asked for (launcher/plan/qosshare.py): no
preset or typed size is shrunk to a QOS share. Where Slurm cannot be asked a
dry run says what the preset's share would be and changes nothing; where it
can, the QOS's real limits (sacctmgr) refuse an over-limit request before
anything is submitted, naming the limit, the request and what to change
(the dry run: tests/local/test_fit_dry_run.py; the test cluster's limits:
tests/cluster/test_fit_cluster.py)."""

from __future__ import annotations

import dataclasses
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
