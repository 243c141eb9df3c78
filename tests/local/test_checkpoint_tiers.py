"""Tiered checkpoints end to end with real processes, real gloo and a real
HTTP S3 endpoint (moto's server on 127.0.0.1): resume from S3, resharding,
corruption, an S3 outage, SIGKILL trials, and credential hygiene.

The training loop is ``scripts/ckpt_drill.py`` (FSDP2 MLP whose losses
depend only on the step), so resumed runs must reproduce an uninterrupted
run's losses. The SIGKILL trials drive the real trainer (``python -m
launcher``): tests/local/test_checkpoint_kill.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import free_port
from loopback_s3 import BUCKET, S3Server

from launcher.config.runid import RUN_ID_FILE, read_run_id
from launcher.config.schema import ClusterConfig, ModelConfig, RunConfig, StorageConfig, TrainConfig
from launcher.config.spec import RunSpec, save_spec
from launcher.plan.make import make_plan
from train.checkpoint.manifest import Manifest, list_steps
from train.checkpoint.store import data_name

# Unique strings: if they show up anywhere, a credential leaked.
ACCESS_KEY = "AKIAMESHRUNLEAKCHECK7"
SECRET_KEY = "meshrunSecretLeakCheck/0123456789abcdefXYZ"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3():
    server = S3Server(ACCESS_KEY, SECRET_KEY)
    server.start()
    server.client().create_bucket(Bucket=BUCKET)
    yield server
    if server.server is not None:
        server.stop()


def _env(world: int, nodes: int = 1) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_DEFAULT_REGION="us-east-1",
        PYTHONPATH=str(REPO),
        OMP_NUM_THREADS="1",
    )
    return env


def make_run(
    run_dir: Path, *, world: int, steps: int, every: int, s3: S3Server | None, dim: int = 64, **storage
) -> RunSpec:
    st = StorageConfig(save_every_steps=every, keep_local=2, keep_remote=3, **storage)
    if s3 is not None:
        st.s3_bucket, st.s3_endpoint_url = BUCKET, s3.url
        st.upload_retry_max_s = 0.5  # tests: retry quickly after an outage
    cfg = RunConfig(
        cluster=ClusterConfig(local_processes=world),
        model=ModelConfig(dim=dim),
        storage=st,
        train=TrainConfig(steps=steps, warmup_steps=3),
    )
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(run_dir))
    save_spec(spec)
    return spec


def start_drill(
    run_dir: Path, world: int, *, nodes: int = 1, args: tuple[str, ...] = ()
) -> list[subprocess.Popen]:
    """``world`` ranks; ``nodes`` > 1 makes each group of ranks its own node
    (the multi-node upload protocol, on one machine)."""
    env = _env(world)
    port = free_port()
    per_node = world // nodes
    procs = []
    logs = run_dir / "drill_logs"
    logs.mkdir(exist_ok=True)
    for r in range(world):
        e = dict(
            env,
            RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(r % per_node),
            LOCAL_WORLD_SIZE=str(per_node),
            GROUP_RANK=str(r // per_node),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        out = open(logs / f"rank{r}.{time.monotonic_ns()}.log", "w")  # noqa: SIM115 (closed with the process)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(REPO / "scripts" / "ckpt_drill.py"), str(run_dir), *args],
                env=e,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        )
        out.close()
    return procs


def run_drill(
    run_dir: Path, world: int, *, nodes: int = 1, timeout_s: float = 180, args: tuple[str, ...] = ()
) -> str:
    procs = start_drill(run_dir, world, nodes=nodes, args=args)
    codes = [p.wait(timeout_s) for p in procs]
    text = all_logs(run_dir)
    assert codes == [0] * world, text[-4000:]
    return text


def all_logs(run_dir: Path) -> str:
    return "".join(p.read_text() for p in sorted((run_dir / "drill_logs").glob("*.log")))


def losses(run_dir: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in (run_dir / "drill_losses.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.setdefault(r["step"], r["loss"])
        # Every re-run of a step (after a resume) must reproduce it exactly.
        assert r["loss"] == out[r["step"]], (r, out[r["step"]])
    return out


def resumes(run_dir: Path) -> list[int]:
    return [
        json.loads(line)["resumed"] for line in (run_dir / "drill_resumes.jsonl").read_text().splitlines()
    ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, s3: S3Server) -> Path:
    """2 ranks as 2 nodes, 12 steps, saves at 4, 8, 12, uploaded to S3."""
    run_dir = tmp_path_factory.mktemp("ckpt") / "ref"
    make_run(run_dir, world=2, steps=12, every=4, s3=s3)
    # Steps slow enough that on a loaded machine the uploads of 4 and 8 are
    # rarely superseded by the next save (test_resume_from_s3_after_local_loss
    # needs an older complete remote copy).
    run_drill(run_dir, 2, nodes=2, args=("--step-sleep-s", "0.1"))
    return run_dir


def test_upload_protocol_and_retention(reference: Path, s3: S3Server) -> None:
    run_prefix = f"meshrun/{read_run_id(reference)}"  # the run id names its S3 prefix
    prefix = f"{run_prefix}/step_12/"
    keys = s3.keys(prefix)
    # Both nodes reported; each uploaded its own rank's files; manifest present.
    manifest = Manifest.from_json(
        s3.client().get_object(Bucket=BUCKET, Key=f"{prefix}manifest.json")["Body"].read()
    )
    for name in ("_nodes/node_0.json", "_nodes/node_1.json", "manifest.json"):
        assert f"{prefix}{name}" in keys, keys
    # The files live under the manifest's generation, and nothing else is there.
    files = {f"{prefix}{data_name(manifest, n)}" for n in manifest.files}
    assert {".metadata", "__1_0.distcp"} <= set(manifest.files) and files <= set(keys), keys
    assert set(keys) == files | {
        f"{prefix}_nodes/node_0.json",
        f"{prefix}_nodes/node_1.json",
        f"{prefix}manifest.json",
    }
    marker = json.loads(
        s3.client().get_object(Bucket=BUCKET, Key=f"{prefix}_nodes/node_1.json")["Body"].read()
    )
    assert marker["files"] == ["__1_0.distcp", "extra_rank1.pt"], marker
    # Saves return at once, so an upload may be superseded by a newer save.
    remote = s3.complete_steps(read_run_id(reference))
    assert remote[-1] == 12 and set(remote) <= {4, 8, 12}, remote
    assert list_steps(reference / "checkpoints") == [8, 12]  # keep_local=2
    report = json.loads((reference / "drill_report.json").read_text())
    assert report["uploads_done"] and report["uploaded"] == {f"s3://{BUCKET}/{run_prefix}": 12}, report
    assert report["saves"] == 3 and report["upload_mb_per_s"] > 0, report


def test_resume_from_s3_after_local_loss(reference: Path, s3: S3Server, tmp_path: Path) -> None:
    """Local copies gone; the newest remote copy (12) made incomplete: resume
    downloads the newest complete older one from S3, and the losses equal
    the uninterrupted run's."""
    ref = losses(reference)
    run_dir = tmp_path / "ref"
    # The same run (its id, hence its S3 prefix) in a fresh directory: a
    # machine that lost its local copies.
    run_dir.mkdir()
    shutil.copy(reference / RUN_ID_FILE, run_dir / RUN_ID_FILE)
    run_id = make_run(run_dir, world=2, steps=12, every=4, s3=s3).run_id
    assert run_id == read_run_id(reference)
    s3.client().delete_object(Bucket=BUCKET, Key=f"meshrun/{run_id}/step_12/manifest.json")
    older = s3.complete_steps(run_id)[-1]
    assert older in (4, 8)
    log = run_drill(run_dir, 2, nodes=2)
    assert resumes(run_dir) == [older]
    assert f"fetched step {older} from s3://" in log, log[-3000:]
    again = losses(run_dir)
    assert sorted(again) == list(range(older + 1, 13))
    assert all(again[s] == ref[s] for s in again), (again, ref)
    assert s3.complete_steps(run_id)[-1] == 12  # re-saved and re-uploaded


def _copy_local(reference: Path, dest: Path, *, world: int, drop: tuple[int, ...] = ()) -> None:
    make_run(dest, world=world, steps=12, every=4, s3=None)
    shutil.copytree(reference / "checkpoints", dest / "checkpoints")
    for s in drop:
        shutil.rmtree(dest / "checkpoints" / f"step_{s}")


def test_resume_at_other_world_size(reference: Path, tmp_path: Path) -> None:
    """Saved by 2 FSDP ranks, loaded by 1: DCP reshards model and optimizer."""
    ref = losses(reference)
    run_dir = tmp_path / "one"
    _copy_local(reference, run_dir, world=1, drop=(12,))
    log = run_drill(run_dir, 1)
    assert resumes(run_dir) == [8]
    assert "saved on 2 ranks" in log and "now 1 ranks" in log, log[-2000:]
    again = losses(run_dir)
    assert sorted(again) == [9, 10, 11, 12]
    for s in again:
        assert again[s] == pytest.approx(ref[s], rel=1e-5, abs=1e-6), (s, again[s], ref[s])


def test_corrupt_shard_falls_back_to_previous(reference: Path, tmp_path: Path) -> None:
    ref = losses(reference)
    run_dir = tmp_path / "corrupt"
    _copy_local(reference, run_dir, world=2)
    shard = run_dir / "checkpoints" / "step_12" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x5A
    shard.write_bytes(bytes(data))
    log = run_drill(run_dir, 2)
    assert "__1_0.distcp fails its xxh3_128 check" in log, log[-3000:]
    assert resumes(run_dir) == [8]
    again = losses(run_dir)
    assert sorted(again) == [9, 10, 11, 12] and all(again[s] == ref[s] for s in again)


def test_s3_outage_training_continues_upload_completes(s3: S3Server, tmp_path: Path) -> None:
    run_dir = tmp_path / "outage"
    make_run(run_dir, world=1, steps=60, every=5, s3=s3)
    procs = start_drill(run_dir, 1, args=("--step-sleep-s", "0.2"))
    deadline = time.monotonic() + 120
    while 5 not in s3.complete_steps(read_run_id(run_dir)):
        assert time.monotonic() < deadline and procs[0].poll() is None, all_logs(run_dir)[-3000:]
        time.sleep(0.1)
    s3.stop()
    try:
        at_stop = len(losses(run_dir))
        deadline = time.monotonic() + 60
        while "failed (attempt" not in all_logs(run_dir):
            assert time.monotonic() < deadline, all_logs(run_dir)[-3000:]
            time.sleep(0.2)
        time.sleep(1.0)
        # Training went on while S3 was down, and local copies are kept.
        assert procs[0].poll() is None, all_logs(run_dir)[-3000:]
        assert len(losses(run_dir)) >= at_stop + 5, (len(losses(run_dir)), at_stop)
        assert len(list_steps(run_dir / "checkpoints")) >= 1
    finally:
        s3.start()
    assert procs[0].wait(120) == 0, all_logs(run_dir)[-3000:]
    log = all_logs(run_dir)
    assert "training continues, local copy kept at" in log and "reachable again" in log, log[-3000:]
    assert sorted(losses(run_dir)) == list(range(1, 61))
    assert s3.complete_steps(read_run_id(run_dir))[-1] == 60
    report = json.loads((run_dir / "drill_report.json").read_text())
    assert report["uploads_done"] and report["upload_failures"] >= 1, report
    assert list_steps(run_dir / "checkpoints") == [55, 60]


def test_no_credentials_in_logs_run_dir_or_sbatch(reference: Path, tmp_path: Path) -> None:
    from launcher.config.spec import load_spec
    from launcher.slurm.render import render_sbatch

    texts = {str(p): p.read_bytes() for p in reference.rglob("*") if p.is_file()}
    os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = ACCESS_KEY, SECRET_KEY
    try:
        spec = load_spec(reference)
        spec.cfg.cluster.kind = "slurm"
        texts["sbatch"] = render_sbatch(spec, tmp_path / "sub").encode()
    finally:
        del os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    assert any(p.endswith(".log") for p in texts) and len(texts) > 10
    for where, data in texts.items():
        for secret in (ACCESS_KEY, SECRET_KEY):
            assert secret.encode() not in data, f"credential found in {where}"


def test_shared_tier_copy_and_resume(tmp_path: Path) -> None:
    """Tier 2 (a shared filesystem directory) gets a verified copy with the
    manifest last; with tier 1 gone the run resumes from it."""
    shared = tmp_path / "lustre"
    run_dir = tmp_path / "shared"
    tier2 = shared / make_run(run_dir, world=1, steps=8, every=4, s3=None, shared_dir=str(shared)).run_id
    # Paced: the upload of 4 must not be superseded by the save of 8 (the
    # upload process may still be starting when 4 is committed).
    run_drill(run_dir, 1, args=("--step-sleep-s", "0.7"))
    ref = losses(run_dir)
    assert list_steps(tier2) == [4, 8]
    assert (tier2 / "step_8" / "_nodes" / "node_0.json").exists()
    shutil.rmtree(run_dir / "checkpoints")
    (tier2 / "step_8" / "manifest.json").unlink()
    (run_dir / "drill_losses.jsonl").unlink()
    log = run_drill(run_dir, 1)
    assert resumes(run_dir) == [0, 4] and f"fetched step 4 from {tier2}" in log, log[-2000:]
    again = losses(run_dir)
    assert sorted(again) == [5, 6, 7, 8] and all(again[s] == ref[s] for s in again)


def test_manifest_names_outside_the_step_are_refused(reference: Path, s3: S3Server, tmp_path: Path) -> None:
    """Manifests that name files outside their step directory, as whoever
    can write the bucket prefix or the run dir could: S3's newest copies
    name ``../../escaped`` and an absolute path, the local copy names
    ``../../victim`` (a file that exists, whose digest would fail: the old
    resume unlinked it). Every such manifest is refused with its reason,
    the resume takes the newest untouched step, nothing outside a step
    directory is written or deleted."""
    run_dir = tmp_path / "crafted"
    run_dir.mkdir()
    shutil.copy(reference / RUN_ID_FILE, run_dir / RUN_ID_FILE)
    run_id = make_run(run_dir, world=2, steps=12, every=4, s3=s3).run_id
    victim, absolute = run_dir / "victim", tmp_path / "absolute-target"
    victim.write_text("keep")
    bad_names = {"../../escaped": "has a path separator", str(absolute): "has a path separator"}
    client = s3.client()
    remote = s3.complete_steps(run_id)
    crafted = remote[-2:]
    for step, name in zip(crafted, bad_names, strict=False):
        key = f"meshrun/{run_id}/step_{step}/manifest.json"
        d = json.loads(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        d["files"][name] = next(iter(d["files"].values()))
        client.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(d).encode())
    newest_local = list_steps(reference / "checkpoints")[-1]
    local = run_dir / "checkpoints" / f"step_{newest_local}"
    shutil.copytree(reference / "checkpoints" / f"step_{newest_local}", local)
    d = json.loads((local / "manifest.json").read_text())
    d["files"]["../../victim"] = dict(next(iter(d["files"].values())), size=4)
    (local / "manifest.json").write_text(json.dumps(d))
    log = run_drill(run_dir, 2, nodes=2)
    expected = max((s for s in remote if s not in crafted and s != newest_local), default=0)
    assert resumes(run_dir) == [expected], log[-4000:]
    assert victim.read_text() == "keep", "a manifest's name deleted a file outside its step directory"
    assert (
        not absolute.exists() and not (run_dir / "escaped").exists() and not (tmp_path / "escaped").exists()
    )
    assert "file name '../../victim' has a path separator" in log, log[-4000:]
    for step, name in zip(crafted, bad_names, strict=False):
        assert (
            f"step {step} has an unusable manifest (manifest of step {step} refused: file name {name!r}"
            in log
        )
