"""NCCL presets: per-fabric settings with reasons, merge order with the
cluster preset's env and command-line overrides, the exported task env.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_ops_nccl.py."""

from __future__ import annotations

import pytest

from launcher.config import ncclenv as nccl
from launcher.config.compose import compose
from launcher.config.schema import ClusterConfig
from launcher.config.validate import ConfigError


@pytest.mark.parametrize("fabric", ["ib_hdr", "ib_ndr", "roce_v2", "efa", "nvlink_only", "tcp"])
def test_every_fabric_preset_has_reasons(fabric: str) -> None:
    c = ClusterConfig(fabric=fabric, gpus_per_node=8, fabric_adapters_per_node=8)
    settings = nccl.preset(c)
    assert settings["NCCL_DEBUG"].value == "WARN"
    assert all(s.reason and len(s.reason) > 15 for s in settings.values())
    assert all(isinstance(s.value, str) and s.value for s in settings.values())


def test_fabric_specifics() -> None:
    ib = nccl.task_env(ClusterConfig(fabric="ib_hdr", fabric_adapters_per_node=4))
    # Exact adapter match: a bare "mlx5_1" would also select mlx5_10..19.
    assert ib["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1,mlx5_2,mlx5_3"
    assert ib["NCCL_IB_DISABLE"] == "0" and ib["NCCL_NET_GDR_LEVEL"] == "PXB"
    assert nccl.task_env(ClusterConfig(fabric="nvlink_only"))["NCCL_IB_DISABLE"] == "1"
    assert (
        nccl.task_env(ClusterConfig(fabric="roce_v2", fabric_adapters_per_node=2))["NCCL_IB_GID_INDEX"] == "3"
    )
    assert nccl.task_env(ClusterConfig(fabric="efa"))["FI_PROVIDER"] == "efa"
    assert nccl.task_env(ClusterConfig(fabric="tcp"))["NCCL_IB_DISABLE"] == "1"
    assert nccl.task_env(ClusterConfig(fabric="none")) == {}


def test_merge_order_preset_yaml_cli() -> None:
    base = compose(["cluster=4node"])
    env = nccl.task_env(base.cluster)
    assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker,ib"  # the cluster preset's YAML beats the fabric's
    assert env["NCCL_DEBUG"] == "WARN"
    cli = compose(
        ["cluster=4node", "cluster.env.NCCL_DEBUG=INFO", "+cluster.env.NCCL_IB_QPS_PER_CONNECTION=4"]
    )
    env = nccl.task_env(cli.cluster)
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_IB_QPS_PER_CONNECTION"] == "4"
    unset = compose(["cluster=4node", "++cluster.env.NCCL_NET_GDR_LEVEL="])
    assert "NCCL_NET_GDR_LEVEL" not in nccl.task_env(unset.cluster)
    rows = {r[0]: r for r in nccl.describe(unset.cluster)}
    assert rows["NCCL_NET_GDR_LEVEL"][1:3] == ("(unset)", "cluster.env")
    assert rows["NCCL_IB_HCA"][2] == "fabric:ib_hdr"


def test_bad_env_name_is_a_config_error() -> None:
    c = ClusterConfig(fabric="tcp", env={"BAD-NAME": "1"})
    with pytest.raises(ConfigError, match="cluster.env.BAD-NAME"):
        nccl.task_env(c)


def test_expected_busbw() -> None:
    four = compose(["cluster=4node"]).cluster
    assert nccl.expected_busbw_gb_per_s(four) == pytest.approx(8 * 200 / 8 * 0.85)
    assert nccl.expected_busbw_gb_per_s(four, nodes=1) == pytest.approx(900 / 2 * 0.8)
    assert nccl.expected_busbw_gb_per_s(compose([]).cluster) == 0.0
    four.expected_busbw_gb_per_s = 123.0
    assert nccl.expected_busbw_gb_per_s(four) == 123.0
