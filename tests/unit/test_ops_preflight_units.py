"""Preflight: parsers on recorded tool outputs, checks against presets, this
machine's run, a forced failure, S3 against a real (moto) endpoint, and the
all-reduce test over 2 gloo ranks.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_ops_preflight.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.ncclenv import apply
from launcher.nodecheck import hostcheck as hc

DATA = Path(__file__).resolve().parents[1] / "data" / "preflight"


def read(name: str) -> str:
    return (DATA / name).read_text()


def ib_cfg(**over: str):
    cfg = compose(["cluster=4node", *[f"{k}={v}" for k, v in over.items()]])
    apply(cfg.cluster)
    return cfg


def test_topo_parser_all_nvlink() -> None:
    links = hc.parse_topo_matrix(read("topo_h100_nvlink.txt"))
    assert len(links) == 8 * 7
    assert links[(0, 7)] == "NV18"
    check = hc.check_nvlink(links, 8)
    assert check.status == hc.PASS and "all 28 GPU pairs" in check.detail


def test_topo_parser_names_the_broken_pair() -> None:
    links = hc.parse_topo_matrix(read("topo_h100_broken_pair.txt"))
    assert links[(2, 5)] == "SYS" and links[(5, 2)] == "SYS"
    check = hc.check_nvlink(links, 8)
    assert check.status == hc.FAIL and check.detail == "1 GPU pairs not on NVLink: GPU2-GPU5:SYS"


def test_topo_parser_pcie_box_and_missing_gpus() -> None:
    links = hc.parse_topo_matrix(read("topo_pcie.txt"))
    assert hc.check_nvlink(links, 8).status == hc.FAIL
    assert "expected 16" in hc.check_nvlink(links, 16).detail
    with pytest.raises(ValueError, match="no GPU header"):
        hc.parse_topo_matrix("No devices were found\n")


def test_ibstat_parser() -> None:
    ports = hc.parse_ibstat(read("ibstat_hdr_degraded.txt"))
    assert len(ports) == 10
    by = {p.ca: p for p in ports}
    assert (by["mlx5_0"].state, by["mlx5_0"].rate_gbit, by["mlx5_0"].link_layer) == (
        "Active",
        200.0,
        "InfiniBand",
    )
    assert by["mlx5_5"].rate_gbit == 100.0
    assert (by["mlx5_6"].state, by["mlx5_6"].physical_state) == ("Down", "Polling")
    assert by["mlx5_8"].link_layer == "Ethernet"


def test_ibdev2netdev_parser() -> None:
    ports = hc.parse_ibdev2netdev(read("ibdev2netdev_hdr_port_down.txt"))
    assert [p.ca for p in ports] == [f"mlx5_{i}" for i in range(10)]
    assert ports[0].netdev == "ibp12s0" and ports[0].state == "Active"
    assert ports[6].state == "Down"


def test_ib_check_against_the_preset() -> None:
    cfg = ib_cfg()
    assert hc.expected_hcas(cfg) == [f"mlx5_{i}" for i in range(8)]
    ok = hc.check_ib(hc.parse_ibstat(read("ibstat_hdr_ok.txt")), cfg, "ibstat")
    assert ok.status == hc.PASS and "8 InfiniBand ports active at 200 Gb/s" in ok.detail
    bad = hc.check_ib(hc.parse_ibstat(read("ibstat_hdr_degraded.txt")), cfg, "ibstat")
    assert bad.status == hc.FAIL
    assert "7/8 active" in bad.detail and "mlx5_6/1:Down" in bad.detail and "mlx5_5/1:100G" in bad.detail
    # ibdev2netdev has no rate: state is checked, the rate is a warning.
    warn = hc.check_ib(hc.parse_ibdev2netdev(read("ibdev2netdev_hdr_ok.txt")), cfg, "ibdev2netdev -v")
    assert warn.status == hc.WARN and "rate not verified" in warn.detail
    down = hc.check_ib(hc.parse_ibdev2netdev(read("ibdev2netdev_hdr_port_down.txt")), cfg, "ibdev2netdev -v")
    assert down.status == hc.FAIL and "mlx5_6" in down.detail
    # A preset listing an adapter the node lacks.
    cfg.cluster.env["NCCL_IB_HCA"] = "=mlx5_0,mlx5_12"
    assert (
        "adapters missing: mlx5_12"
        in hc.check_ib(hc.parse_ibstat(read("ibstat_hdr_ok.txt")), cfg, "ibstat").detail
    )


def test_gpu_check_against_the_preset() -> None:
    cfg = ib_cfg()
    h100 = ["NVIDIA H100 80GB HBM3"] * 8
    assert hc.check_gpus(cfg, "cuda", h100, "NVML").status == hc.PASS
    assert "7 GPUs found" in hc.check_gpus(cfg, "cuda", h100[:7], "NVML").detail
    wrong = hc.check_gpus(cfg, "cuda", ["NVIDIA A100-SXM4-80GB"] * 8, "NVML")
    assert wrong.status == hc.FAIL and "A100" in wrong.detail
    assert hc.check_gpus(cfg, "cpu", [], "NVML").status == hc.SKIP


def test_ram_check() -> None:
    cfg = ib_cfg()  # preset: 2048 GB
    total, avail = hc.meminfo_gb(
        "MemTotal:       2113929216 kB\nMemFree: 1 kB\nMemAvailable:   2013929216 kB\n"
    )
    assert round(total) == 2016 and hc.check_ram(cfg, total, avail).status == hc.PASS  # GiB, as RealMemory
    short = hc.check_ram(cfg, 1000.0, 900.0)
    assert short.status == hc.FAIL and "set cluster.mem_per_node_gb=1000 " in short.detail, short
    assert hc.check_ram(cfg, 1700.0, 1600.0).status == hc.WARN


def test_ram_check_against_slurms_figure() -> None:
    """The preset is held to Slurm's RealMemory for the node (what `meshrun
    init` writes); the host to Slurm's figure unless config_overrides says it
    is nominal (the test cluster: 4 nodes of 256 GB on one ~24 GB host)."""
    cfg = ib_cfg()  # preset: 2048 GB
    real = hc.SlurmMemory("n1", 2015.0, overrides=False)
    over = hc.check_ram(cfg, 2016.0, 2000.0, real)
    assert over.status == hc.FAIL and "set cluster.mem_per_node_gb=2015 " in over.detail, over
    assert "Slurm's RealMemory for n1 2015 GB" in over.detail
    cfg.cluster.mem_per_node_gb = 2015
    assert hc.check_ram(cfg, 2016.0, 2000.0, real).status == hc.PASS
    assert hc.check_ram(cfg, 900.0, 800.0, real).status == hc.FAIL  # a node short of its memory
    cfg.cluster.mem_per_node_gb = 256
    nominal = hc.check_ram(cfg, 23.6, 21.0, hc.SlurmMemory("node2", 256.0, overrides=True))
    assert nominal.status == hc.WARN and "config_overrides" in nominal.detail, nominal


def test_space_check_counts_dataset_twice_and_checkpoints(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "shard0.bin").write_bytes(b"\0" * 1_000_000)
    cfg = compose(
        [f"cluster.scratch_path={tmp_path}", f"data.path={data}", "storage.keep_local=2", "data=tokens"]
    )
    check = hc.check_space(cfg, params=1_000_000, nodes=1, checkpoint_dir=str(tmp_path / "ckpt"))
    assert check.status == hc.PASS
    # 2 x 1 MB of data + 3 x 12 MB of checkpoints on the same filesystem.
    assert "needs 0.0 GB" in check.detail and "2x dataset 0.00 GB" in check.detail
    need = 2 * 1_000_000 + 3 * 12_000_000
    cfg.cluster.preflight_min_free_gb = 1e6
    big = hc.check_space(cfg, params=1_000_000, nodes=1, checkpoint_dir=str(tmp_path))
    assert big.status == hc.FAIL and f"{(need + 1e15) / 1e9:.1f} GB" in big.detail


def test_allreduce_judgement() -> None:
    from train.observe.preflight_comm import busbw_gb_per_s, judge

    # nccl-tests' definition: 1 GB in 10 ms over 8 ranks = 100 GB/s algbw, 175 busbw.
    assert busbw_gb_per_s(1_000_000_000, 0.01, 8) == pytest.approx(175.0)
    assert judge(160.0, 170.0)[0] == "pass"
    assert judge(120.0, 170.0)[0] == "warn"
    status, why = judge(40.0, 170.0)
    assert status == "fail" and "24% of the expected 170 GB/s" in why
    assert judge(1.0, 0.0)[0] == "pass"
