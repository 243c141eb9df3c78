"""Preflight: parsers on recorded tool outputs, checks against presets, this
machine's run, a forced failure, S3 against a real (moto) endpoint, and the
all-reduce test over 2 gloo ranks."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.ncclenv import apply
from launcher.nodecheck import hostcheck as hc

DATA = Path(__file__).resolve().parents[1] / "data" / "preflight"
ROOT = DATA.parent.parent.parent


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
    assert round(total) == 2165 and hc.check_ram(cfg, total, avail).status == hc.PASS
    assert hc.check_ram(cfg, 1000.0, 900.0).status == hc.FAIL
    assert hc.check_ram(cfg, 1700.0, 1600.0).status == hc.WARN


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


def test_this_machine_passes_what_applies() -> None:
    """`python -m launcher.preflight` here: checks that apply pass, the rest
    skip with a reason; the all-reduce test ran over 2 gloo ranks."""
    p = subprocess.run(
        [sys.executable, "-m", "launcher.preflight"], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {line.split()[1]: line.split()[2] for line in p.stdout.splitlines()[1:] if line.strip()}
    assert rows == {
        "gpus": "SKIP",
        "nvlink": "SKIP",
        "infiniband": "SKIP",
        "scratch": "PASS",
        "ram": "PASS",
        "s3": "SKIP",
        "allreduce": "PASS",
    }, p.stdout
    assert "GB/s bus bandwidth" in p.stdout and "over 2 ranks (gloo" in p.stdout


def test_forced_failure_stops_and_names_the_node(tmp_path: Path) -> None:
    """The job-step mode on a planned run dir: a free-space threshold no disk
    meets fails, exits 1 and names the node; --record (the batch host) makes
    it a fault and a ledger line, and says whether the job goes on without it."""
    from launcher.config.spec import RunSpec, save_spec
    from launcher.plan.make import make_plan

    cfg = compose(["cluster.preflight_min_free_gb=1e9", f"launcher.runs_root={tmp_path}"])
    run = tmp_path / "run"
    plan = make_plan(cfg)
    save_spec(RunSpec(cfg, plan, str(run)))
    p = subprocess.run(
        [sys.executable, "-m", "launcher.preflight", "--node", str(run)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "SLURMD_NODENAME": "node3"},
    )
    assert p.returncode == 1
    assert "preflight FAILED on node(s) node3: node3: scratch" in p.stderr
    assert "Training was not started" not in p.stderr  # the batch script's --record decides
    saved = json.loads((run / "preflight" / "node3.json").read_text())
    assert {c["name"]: c["status"] for c in saved["checks"]}["scratch"] == "fail"
    r = subprocess.run(
        [sys.executable, "-m", "launcher.preflight", "--report", str(run)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "node3" in r.stdout and "FAIL" in r.stdout
    _record(cfg, plan, run, saved)


def _record(cfg, plan, run: Path, saved: dict) -> None:  # type: ignore[no-untyped-def]
    from launcher.config import nodeledger
    from launcher.config.health import read_faults
    from launcher.nodecheck.nodepreflight import record_failures

    assert saved["job"] == "" and saved["restart"] == "0"  # which start wrote it (no Slurm job here)
    assert plan.nodes == 1
    # No result from node5: nothing is recorded, the job ends.
    assert record_failures(str(run), ["node3", "node5"], "", "0") == (1, "")
    assert read_faults(run) == []
    # node4 passed (its result as --node writes it): node3 is set aside.
    ok = {**saved, "node": "node4", "checks": [{**c, "status": "pass"} for c in saved["checks"]]}
    (run / "preflight" / "node4.json").write_text(json.dumps(ok))
    rc, flags = record_failures(str(run), ["node3", "node4"], "", "0")
    rpn = plan.ranks_per_node
    assert rc == 0, flags
    assert flags.startswith(
        f"--exclude=node3 --nodes=1 --ntasks={rpn} --ntasks-per-node={rpn} --export=ALL,MASTER_ADDR="
    )
    (fault,) = read_faults(run)
    assert (fault["cause"], fault["node"], fault["action"], fault["attempt"]) == (
        "preflight",
        "node3",
        "exclude",
        "0.preflight",
    )
    assert fault["evidence"]["failed"][0]["name"] == "scratch" and fault["error"].startswith(
        "preflight: scratch ("
    )
    # No spare: recorded too, and the job ends. Another start's results are not read.
    assert record_failures(str(run), ["node3"], "", "0") == (1, "")
    assert read_faults(run)[-1]["action"] == "stop: too few nodes"
    assert record_failures(str(run), ["node3", "node4"], "", "1") == (1, "")  # restart 1: no results yet
    ledger = nodeledger.read(nodeledger.ledger_path(cfg))
    assert [(r["node"], r["cause"]) for r in ledger] == [("node3", "preflight")] * 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_s3_check_against_a_real_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    moto_server = pytest.importorskip("moto.server")
    import boto3

    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        url = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket="ckpts")
        cfg = compose(
            [f"storage.s3_endpoint_url={url}", "storage.s3_bucket=ckpts", "storage.s3_required=true"]
        )
        ok = hc.check_s3(cfg)
        assert ok.status == hc.PASS and "s3://ckpts" in ok.detail
        cfg.storage.s3_bucket = "missing"
        miss = hc.check_s3(cfg)
        assert miss.status == hc.FAIL and ("404" in miss.detail or "NoSuchBucket" in miss.detail)
        cfg.storage.s3_required = False
        assert hc.check_s3(cfg).status == hc.WARN
        for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(var)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        cfg.storage.s3_bucket, cfg.storage.s3_required = "ckpts", True
        nocred = hc.check_s3(cfg)
        assert nocred.status == hc.FAIL and "no AWS credentials" in nocred.detail
    finally:
        server.stop()
    cfg.storage.s3_bucket = ""
    assert hc.check_s3(cfg).status == hc.SKIP


def test_allreduce_judgement() -> None:
    from train.observe.preflight_comm import busbw_gb_per_s, judge

    # nccl-tests' definition: 1 GB in 10 ms over 8 ranks = 100 GB/s algbw, 175 busbw.
    assert busbw_gb_per_s(1_000_000_000, 0.01, 8) == pytest.approx(175.0)
    assert judge(160.0, 170.0)[0] == "pass"
    assert judge(120.0, 170.0)[0] == "warn"
    status, why = judge(40.0, 170.0)
    assert status == "fail" and "24% of the expected 170 GB/s" in why
    assert judge(1.0, 0.0)[0] == "pass"
