"""Node-local resume with the real trainer (``python -m train``): two
"nodes" of one rank each, each with its own tier-1 directory
(``storage.local_dir`` expanded per node), and S3 on moto's HTTP server.

A node holds only its own shards (and DCP's .metadata); on resume each node
verifies what it holds, the ranks agree on the newest step every node holds,
and the few items a rank reads from another node's files come from that
node. S3 is needed only for what no node holds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness import free_port
from loopback_s3 import BUCKET, S3Server

from launcher.config.schema import (
    ClusterConfig,
    ModelConfig,
    ParallelismConfig,
    RunConfig,
    StorageConfig,
    TrainConfig,
)
from launcher.config.spec import RunSpec, load_spec, save_spec
from launcher.plan.make import make_plan
from train.checkpoint.manifest import list_steps

REPO = Path(__file__).resolve().parents[2]


def make_spec(run_dir: Path, nvme: Path, s3: S3Server) -> str:
    """Write the run's spec; returns its run id (names its tier-1 dirs and S3 prefix)."""
    st = StorageConfig(
        local_dir=f"{nvme}/node$GROUP_RANK",  # expanded on each node
        save_every_steps=4,
        keep_local=3,
        s3_bucket=BUCKET,
        s3_endpoint_url=s3.url,
        upload_retry_max_s=0.5,
        upload_timeout_min=0.1,  # S3 is stopped in one run: don't wait 10 min for it
    )
    cfg = RunConfig(
        cluster=ClusterConfig(local_processes=2, metrics_port=0),
        model=ModelConfig(
            name="tiny", dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=256, seq_len=16
        ),
        parallelism=ParallelismConfig(mode="fsdp", precision="fp32"),
        storage=st,
        train=TrainConfig(steps=12, warmup_steps=3, global_batch_size=4, log_every_steps=1),
    )
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(run_dir))
    save_spec(spec)
    return spec.run_id


def run_two_nodes(run_dir: Path, s3: S3Server, tag: str) -> str:
    """Rank r is node r (LOCAL_WORLD_SIZE=1): what a 2-node Slurm job's
    tasks see, on one machine."""
    port = free_port()
    procs, logs = [], []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SLURM_"))}
        env.update(
            RANK=str(r),
            WORLD_SIZE="2",
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            GROUP_RANK=str(r),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(REPO),
            AWS_ACCESS_KEY_ID=s3.access_key,
            AWS_SECRET_ACCESS_KEY=s3.secret_key,
            AWS_DEFAULT_REGION="us-east-1",
        )
        log = run_dir / f"{tag}.node{r}.log"
        logs.append(log)
        with open(log, "w") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "train", str(run_dir)],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                )
            )
    codes = [p.wait(300) for p in procs]
    text = "".join(f"--- {p.name}\n{p.read_text()}" for p in logs)
    assert codes == [0, 0], text[-5000:]
    return text


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture()
def s3():
    server = S3Server()
    server.start()
    server.client().create_bucket(Bucket=BUCKET)
    yield server
    if server.server is not None:
        server.stop()


def test_two_nodes_resume_from_node_local_copies(tmp_path: Path, s3: S3Server) -> None:
    run_dir, nvme = tmp_path / "nodes", tmp_path / "nvme"
    run_id = make_spec(run_dir, nvme, s3)
    run_two_nodes(run_dir, s3, "first")
    ref = {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}
    assert sorted(ref) == list(range(1, 13))
    node = [nvme / f"node{k}" / run_id for k in (0, 1)]
    for k in (0, 1):
        # Each node's tier 1 holds its own rank's shard only (+ .metadata, manifest).
        assert list_steps(node[k]) == [4, 8, 12]
        names = os.listdir(node[k] / "step_12")
        assert f"__{k}_0.distcp" in names and f"__{1 - k}_0.distcp" not in names, names
        assert ".metadata" in names and "manifest.json" in names
    # Saves return at once, so an older step's upload may be superseded by a newer one.
    remote = s3.complete_steps(run_id)
    assert remote[-1] == 12 and set(remote) <= {4, 8, 12}, remote

    # Node 1 lost step 12; S3 is up: only node 1 downloads, and only its part
    # (its shard and per-rank state; .metadata is fetched when the step is tried).
    shutil.rmtree(node[1] / "step_12")
    (run_dir / "metrics.jsonl").write_text("")
    log = run_two_nodes(run_dir, s3, "second")
    assert [r["step"] for r in metrics(run_dir) if r.get("event") == "resume"] == [12]
    fetched = [line for line in log.splitlines() if "fetched step" in line]
    assert len(fetched) == 1 and "[ckpt rank 1]" in fetched[0] and "(2 files," in fetched[0], fetched
    assert sorted(os.listdir(node[1] / "step_12")).count("__0_0.distcp") == 0

    # Node 1 lost step 12 again, and S3 is down: asked to (launcher.resume=
    # local_only; without it such a start fails, tests/local/test_checkpoint_unlisted_tier.py),
    # resume from 8, the newest step both nodes hold, without S3; the losses
    # continue exactly.
    shutil.rmtree(node[1] / "step_12")
    (run_dir / "metrics.jsonl").write_text("")
    s3.stop()
    spec = load_spec(run_dir)
    spec.cfg.launcher.resume = "local_only"
    save_spec(spec)
    log = run_two_nodes(run_dir, s3, "third")
    recs = metrics(run_dir)
    assert [r["step"] for r in recs if r.get("event") == "resume"] == [8], log[-4000:]
    assert "fetched step" not in log and "cannot list s3://" in log, log[-4000:]
    again = {r["step"]: r["loss"] for r in recs if "loss" in r}
    assert sorted(again) == [9, 10, 11, 12]
    for s, loss in again.items():
        assert abs(loss - ref[s]) <= 1e-6, (s, loss, ref[s])
    for k in (0, 1):
        assert list_steps(node[k]) == [4, 8, 12]
