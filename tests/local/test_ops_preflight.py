"""Preflight: parsers on recorded tool outputs, checks against presets, this
machine's run, a forced failure, S3 against a real (moto) endpoint, and the
all-reduce test over 2 gloo ranks.
Tests that start no process: tests/unit/test_ops_preflight_units.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness import free_port

from launcher.config.compose import compose
from launcher.nodecheck import hostcheck as hc

DATA = Path(__file__).resolve().parents[1] / "data" / "preflight"
ROOT = DATA.parent.parent.parent


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


def test_s3_check_against_a_real_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    moto_server = pytest.importorskip("moto.server")
    import boto3

    port = free_port()
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
