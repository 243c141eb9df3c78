"""``meshrun init``'s parsers on Slurm's own output forms and a fake
/sys/class/infiniband, into presets (the written presets on the test cluster:
tests/cluster/test_init.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.slurm import discover
from launcher.slurm.initpreset import cluster_field_sets, cluster_preset, qos_presets

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
