"""Goodput and ``meshrun fleet`` against the real local Slurm cluster
(scripts/testcluster.sh): a run preempted once, a job pending on a full QOS,
totals per QOS against sacct."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from testcluster_util import require_test_cluster

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slurm
BASE = [
    "cluster=testcluster",
    "model=tiny",
    "launcher.exclusive=false",
    "qos.time_limit_min=4",
    "launcher.signal_lead_s=30",
    "cluster.nodes=1",
    "cluster.gpus_per_node=2",
]


@pytest.fixture(scope="module", autouse=True)
def slurm_env():
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = require_test_cluster()
    yield
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


def fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", "fleet", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def wait_ended(job: str, timeout: float) -> None:
    from launcher.slurm.cluster import jobs

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = jobs([job]).get(job)
        if rec and rec.state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            assert rec.state == "COMPLETED", rec
            return
        time.sleep(2)
    raise AssertionError(f"job {job} did not end in {timeout} s")


def step_records(run_dir: Path) -> list[dict]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if "loss" in r and "event" not in r]


def sacct_gpu_seconds(job: str) -> float:
    """Allocated GPU-seconds of every run of the job, straight from sacct."""
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-D", "-j", job, "--format=ElapsedRaw,AllocTRES"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    total = 0.0
    for line in out.splitlines():
        elapsed, tres = line.split("|")
        gpus = next((int(x.split("=")[1]) for x in tres.split(",") if x.startswith("gres/gpu=")), 0)
        total += int(elapsed) * gpus
    return total


def test_preempted_run_goodput_adds_up_and_counts_redone_steps(tmp_path: Path) -> None:
    """A research job preempted once by a training-QOS job, whose save on
    the signal (and every save after step 25) is suppressed in its first
    start, as when the kill comes before the save: the requeued job resumes
    from step 25 and redoes the steps after it. Its goodput.json
    buckets add up to the GPU-seconds sacct says it was allocated (within
    2%), and the redone-steps figure equals the steps logged twice."""
    from launcher.config import nccl
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.run.rundir import write_run_dir
    from launcher.slurm.submit import _submit, _write_job_file

    run_dir = tmp_path / "runs" / "victim"
    cfg = compose([*BASE, "train.steps=150", "train.log_every_steps=1", "storage.save_every_steps=25"])
    nccl.apply(cfg.cluster)
    spec = RunSpec(cfg, make_plan(cfg), str(run_dir))
    write_run_dir(spec)
    inject = (
        "import os, train.checkpoint.manager as m\n"
        "if (os.environ.get('SLURM_RESTART_COUNT') or '0') == '0':\n"
        "    real = m.CheckpointManager.should_save\n"
        "    def should_save(self, step, *, final=False, preempted=False):\n"
        "        return step <= 25 and real(self, step, final=final, preempted=False)\n"
        "    m.CheckpointManager.should_save = should_save\n"
        "from train.signals import _main\n"
        "raise SystemExit(_main())\n"
    )
    command = f"{sys.executable} -u -c {shlex.quote(f'exec({inject!r})')} {run_dir}"
    job = _submit(spec, run_dir / "slurm", command)
    _write_job_file(str(run_dir), job)
    deadline = time.monotonic() + 240
    while (
        not (run_dir / "metrics.jsonl").exists()
        or max([r["step"] for r in step_records(run_dir)] or [0]) < 28
    ):
        assert time.monotonic() < deadline, "the victim did not reach step 28"
        time.sleep(0.5)
    # While it runs, meshrun fleet already writes a (not final) goodput.json.
    out = fleet(str(tmp_path / "runs"))
    assert out.returncode == 0, out.stderr
    running = json.loads((run_dir / "goodput.json").read_text())
    assert running["final"] is False and running["state"] == "RUNNING", running
    node = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%N"], check=True, capture_output=True, text=True, timeout=30
    ).stdout.strip()
    subprocess.run(
        ["sbatch", "--parsable", "-N1", "-w", node, "-p", "training", "-q", "training", "-A", "training",
         "-t", "1", "--mem=200G", "-o", "/dev/null", "--wrap", "sleep 2"],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    wait_ended(job, 300)
    out = fleet(str(tmp_path / "runs"), "--json", "--prom", str(tmp_path / "goodput.prom"))
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    g = json.loads((run_dir / "goodput.json").read_text())
    assert g["final"] is True and g["state"] == "COMPLETED" and g["restarts"] == 1, g
    assert g["requeues"]["preemptions"] == 1, g
    allocated = sacct_gpu_seconds(job)
    total = sum(g["buckets_gpu_s"].values())
    assert abs(total - allocated) <= 0.02 * allocated, (total, allocated, g["buckets_gpu_s"])
    assert abs(g["allocated_gpu_s"] - allocated) <= 0.02 * allocated, (g["allocated_gpu_s"], allocated)
    # Independently: steps logged in both starts (every step is logged).
    counts = Counter(r["step"] for r in step_records(run_dir))
    redone = sum(1 for n in counts.values() if n > 1)
    assert redone > 0 and g["steps"]["redone"] == redone, (g["steps"], redone)
    assert g["steps"]["reached"] == 150 and g["steps"]["productive"] == 150, g["steps"]
    b = g["buckets_gpu_s"]
    assert b["redone"] > 0 and b["restore"] > 0 and b["productive"] > 0 and b["hang_restart"] > 0, b
    assert g["ettr"] == pytest.approx(b["productive"] / g["allocated_gpu_s"])
    (row,) = view["runs"]
    assert row["state"] == "COMPLETED" and row["step"] == 150 and row["restarts"] == 1, row
    prom = (tmp_path / "goodput.prom").read_text()
    assert 'meshrun_goodput_gpu_seconds{run="victim",job_id="' + job + '",bucket="redone"}' in prom, prom
    print("\ngoodput of the preempted run (GPU-seconds):")
    for k, v in b.items():
        print(f"  {k:17s} {v:8.1f}  {100 * v / g['allocated_gpu_s']:5.1f}%")
    print(
        f"  allocated {g['allocated_gpu_s']:.1f} (sacct {allocated:.1f}), queue wait {g['queue_wait_s']:.1f} s, "
        f"ETTR {100 * g['ettr']:.1f}%, redone steps {g['steps']['redone']}"
    )


def test_pending_job_shows_reason_and_qos_totals_match_sacct(tmp_path: Path) -> None:
    """The inference QOS (3 GPUs) held by a 2-GPU job: a 2-GPU meshrun run
    in it pends, and meshrun fleet shows Slurm's reason (QOSGrpGRES) and
    sums GPU-hours per QOS as sacct does for the same jobs."""
    runs = tmp_path / "runs"
    hold = subprocess.run(
        ["sbatch", "--parsable", "-N1", "-p", "inference", "-q", "inference", "-A", "inference",
         "--gres=gpu:2", "--mem=1G", "-t", "2", "-o", "/dev/null", "--wrap", "sleep 60"],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    job = None
    try:
        out = subprocess.run(
            [sys.executable, "-m", "launcher", *BASE, "qos=inference", "qos.time_limit_min=2",
             "train.steps=5", "launcher.mem_gb=1", f"launcher.run_dir={runs / 'waiting'}"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        job = json.loads((runs / "waiting" / "slurm" / "job.json").read_text())["job_id"]
        deadline = time.monotonic() + 60
        while True:
            out = fleet(str(runs), "--json")
            assert out.returncode == 0, out.stderr
            (row,) = json.loads(out.stdout)["runs"]
            if row["state"] == "PENDING" and row["reason"] not in ("", "None", "Priority"):
                break
            assert time.monotonic() < deadline, row
            time.sleep(2)
        assert row["reason"] == "QOSGrpGRES", row
        text = fleet(str(runs)).stdout
        assert "pending:" in text and "QOSGrpGRES" in text, text
    finally:
        subprocess.run(["scancel", hold, *([job] if job else [])], timeout=30, check=False)
    # Totals per QOS over finished and running runs: a finished run in the
    # research QOS next to the cancelled inference one.
    out = subprocess.run(
        [sys.executable, "-m", "launcher", *BASE, "train.steps=5", f"launcher.run_dir={runs / 'done'}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    done = json.loads((runs / "done" / "slurm" / "job.json").read_text())["job_id"]
    wait_ended(done, 240)
    view = json.loads(fleet(str(runs), "--json").stdout)
    per_qos = {g["qos"]: g["gpu_hours"] for g in view["totals"]["qos"]}
    for qos, jid in (("research", done), ("inference", job)):
        assert per_qos[qos] == pytest.approx(sacct_gpu_seconds(jid) / 3600, rel=0.01, abs=1e-6), (
            qos,
            per_qos,
        )
    assert per_qos["research"] > 0, per_qos
    assert view["scheduler_calls"] == 1, view["scheduler_calls"]  # nothing pending now: sacct only
