"""``meshrun init``: presets written from the real cluster.

The parsers on Slurm's own output forms and a fake /sys/class/infiniband
(units); then, on the shared local test cluster (read-only queries), the
written presets reproduce what scripts/testcluster.sh configured (4 nodes of
8 GPUs, 64 CPUs and 256 GB; partitions research / training / inference with
their QOS and GPU shares), an existing preset is not overwritten without
--force, and the written presets compose and dry-run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from testcluster_util import require_test_cluster

from launcher.slurm import discover
from launcher.slurm.initpreset import cluster_field_sets, cluster_preset, qos_presets

ROOT = Path(__file__).resolve().parents[2]

PARTITION = (
    "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ml,normal Default=YES MaxNodes=16 "
    "MaxTime=2-00:00:00 Nodes=g[001-064] TotalNodes=64 TRES=cpu=12288,node=64,gres/gpu=512\n"
    "PartitionName=debug AllowAccounts=ml AllowQos=ALL Default=NO MaxNodes=UNLIMITED MaxTime=30 "
    "Nodes=g[001-002] TotalNodes=2\n"
)
NODE = (
    "NodeName=g001 CPUTot=192 AvailableFeatures=h100,ndr Gres=gpu:h100:8(S:0-1) RealMemory=2063000\n"
    "NodeName=g002 CPUTot=192 AvailableFeatures=h100,ndr Gres=gpu:h100:8(S:0-1) RealMemory=2063000\n"
    "NodeName=login1 CPUTot=32 AvailableFeatures=(null) Gres=(null) RealMemory=128000\n"
)
QOS = "normal|0|||||\nml|20|gres/gpu=4|2-00:00:00|normal|00:05:00\n"
ASSOC = "ml|||\nml||ml,normal|ml\n"


def facts(ib: tuple[list[str], float, str] = ([], 0.0, "")) -> discover.ClusterFacts:
    node, gpus = discover.parse_nodes(NODE)
    return discover.ClusterFacts(
        name="site",
        partitions=discover.parse_partitions(PARTITION),
        node=node,
        total_gpus=gpus,
        qos=discover.parse_qos(QOS),
        associations=discover.parse_assoc(ASSOC),
        config=discover.parse_config("ClusterName = site\nPreemptParameters = send_user_signal\n"),
        pyxis=False,
        nics=ib[0],
        nic_rate_gbit=ib[1],
        nic_link=ib[2],
    )


def test_parsers_read_slurms_forms_into_presets(tmp_path: Path) -> None:
    for i, name in enumerate(["mlx5_0", "mlx5_3"]):
        port = tmp_path / "ib" / name / "ports" / "1"
        port.mkdir(parents=True)
        (port / "rate").write_text(f"{400 if i == 0 else 200} Gb/sec (4X NDR)\n")
        (port / "link_layer").write_text("InfiniBand\n")
    f = facts(discover.infiniband(tmp_path / "ib"))
    assert f.node.count == 2 and f.node.gres_type == "h100" and f.node.features == ["h100", "ndr"]
    assert "USR2" in f.preempt_signal
    cluster, notes = cluster_preset(f, "site", {"price_on_demand_usd_per_node_hour": 98})
    assert (
        cluster["gpus_per_node"] == 8
        and cluster["cpus_per_node"] == 192
        and cluster["mem_per_node_gb"] == 2015
    )
    assert (cluster["gpu_type"], cluster["gpu_mem_gb"], cluster["cluster_nodes"]) == ("H100-80GB-SXM", 80, 64)
    assert cluster["fabric"] == "ib_ndr" and cluster["fabric_adapters_per_node"] == 2
    assert cluster["env"] == {"NCCL_IB_HCA": "=mlx5_0,mlx5_3"}  # the real names, not mlx5_0..1
    assert cluster["price_on_demand_usd_per_node_hour"] == 98
    assert any("Pyxis" in n for n in notes)
    qos, _ = qos_presets(f, "site")
    assert list(qos) == ["site_gpu", "site_debug"]  # the default partition first
    gpu = qos["site_gpu"]
    assert (gpu["qos"], gpu["account"], gpu["time_limit_min"], gpu["cluster_share_pct"]) == (
        "ml",
        "ml",
        2880,
        25.0,
    )
    assert (gpu["preempts"], gpu["grace_time_s"], qos["site_debug"]["time_limit_min"]) == (
        ["normal"],
        300,
        30,
    )
    with pytest.raises(ValueError, match="gpu_memgb=80.*fields: .*gpu_mem_gb"):
        cluster_field_sets(["gpu_memgb=80"])


def init(conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ, MESHRUN_CONFIG_DIR=str(conf), PYTHONPATH=str(ROOT), SLURM_CONF=require_test_cluster()
    )
    cmd = [sys.executable, "-m", "launcher.cli", "init", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=conf.parent)


def configured_in_testcluster_sh(name: str) -> int:
    m = re.search(rf"\b{name}=(\d+)", (ROOT / "scripts" / "testcluster.sh").read_text())
    assert m, name
    return int(m.group(1))


@pytest.mark.slurm
def test_init_on_the_test_cluster_writes_presets_that_compose_and_dry_run(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    p = init(conf, "--name", "tcinit", "--dry-run")
    assert p.returncode == 0, p.stderr
    assert "is not one meshrun knows: set gpu_mem_gb=GB" in p.stdout and not conf.exists()

    p = init(conf, "--name", "tcinit", "gpu_mem_gb=80")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "meshrun init: use it: python -m launcher cluster=tcinit qos=tcinit_research" in p.stdout
    cluster = yaml.safe_load((conf / "cluster" / "tcinit.yaml").read_text())
    nodes, gpus = configured_in_testcluster_sh("NODES"), configured_in_testcluster_sh("GPUS")
    assert (cluster["kind"], cluster["cluster_nodes"], cluster["gpus_per_node"]) == ("slurm", nodes, gpus)
    assert cluster["cpus_per_node"] == configured_in_testcluster_sh("CPUS")
    assert cluster["mem_per_node_gb"] == configured_in_testcluster_sh("MEM_MB") // 1024
    assert {q.name for q in conf.glob("qos/*.yaml")} == {
        f"tcinit_{t}.yaml" for t in ("research", "training", "inference")
    }
    for team in ("research", "training", "inference"):
        got = yaml.safe_load((conf / "qos" / f"tcinit_{team}.yaml").read_text())
        want = yaml.safe_load((ROOT / "conf" / "qos" / f"{team}.yaml").read_text())
        assert (got["partition"], got["qos"], got["account"]) == (team, team, team)
        assert got["time_limit_min"] == want["time_limit_min"] and got["grace_time_s"] == want["grace_time_s"]
        total = nodes * gpus  # the same GPUs as the QOS limit testcluster.sh rendered from conf/qos
        assert int(total * got["cluster_share_pct"] / 100) == int(total * want["cluster_share_pct"] / 100), (
            team
        )
        assert sorted(got["preempts"]) == sorted(want["preempts"]) or not want["preempts"], team

    before = (conf / "cluster" / "tcinit.yaml").read_text()
    p = init(conf, "--name", "tcinit", "gpu_mem_gb=40")
    assert p.returncode == 2 and "add --force to overwrite" in p.stderr, p.stderr
    assert (conf / "cluster" / "tcinit.yaml").read_text() == before
    assert init(conf, "--name", "tcinit", "--force", "gpu_mem_gb=80").returncode == 0

    env = dict(
        os.environ, MESHRUN_CONFIG_DIR=str(conf), PYTHONPATH=str(ROOT), SLURM_CONF=require_test_cluster()
    )
    cmd = [sys.executable, "-m", "launcher", "cluster=tcinit", "qos=tcinit_training", "launcher.dry_run=true"]
    d = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert d.returncode == 0, d.stdout + d.stderr
    assert "#SBATCH --partition=training" in d.stdout and "cluster=tcinit" in d.stdout
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
