"""Goodput and ``meshrun fleet`` against the real local Slurm cluster
(scripts/testcluster.sh): a run preempted once that loses a rank once, a job
pending on a full QOS, totals per QOS against sacct. (Steps redone across
allocations, after a preemption whose save was lost, are checked bucket by
bucket in tests/local/test_fleet_units.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from harness import cluster_base, wait_jobs

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]
BASE = [
    *cluster_base(time_limit_min=4),
    "cluster.nodes=1",
    "cluster.gpus_per_node=2",
]


def fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", "fleet", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def wait_ended(job: str, timeout: float) -> None:
    assert wait_jobs([job], timeout)[job].state == "COMPLETED"


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


def _heartbeat(run_dir: Path, rank: int) -> dict:
    from launcher.config.health import read_heartbeats

    return read_heartbeats(run_dir).get(rank, {})


def test_preempted_once_and_a_rank_lost_once_goodput(tmp_path: Path) -> None:
    """The issue's scenario through ``python -m launcher``: a research run
    (one spare node) preempted once by a training-QOS job (it saves on the
    signal and is requeued), then in its second allocation rank 1 is
    SIGKILLed: the supervisor restarts the training inside the allocation
    from the last periodic checkpoint, redoing the steps after it. Its
    goodput.json adds up to sacct's allocated GPU-seconds (within 2%), the
    redone-steps figure equals the steps logged twice, and the restart's
    gap is in hang_restart."""
    runs = tmp_path / "runs"
    run_dir = runs / "victim"
    out = subprocess.run(
        [sys.executable, "-m", "launcher", *BASE, "qos.time_limit_min=6", "cluster.spare_nodes=1",
         "train.steps=90", "train.log_every_steps=1", "storage.save_every_steps=25",
         "launcher.hang_startup_timeout_s=150", f"launcher.runs_root={tmp_path}", f"launcher.run_dir={run_dir}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    job = json.loads((run_dir / "slurm" / "job.json").read_text())["job_id"]
    deadline = time.monotonic() + 240
    while _heartbeat(run_dir, 0).get("step", 0) < 5:
        assert time.monotonic() < deadline, "the run did not reach step 5"
        time.sleep(0.3)
    node = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%N"], check=True, capture_output=True, text=True, timeout=30
    ).stdout.strip()
    subprocess.run(
        ["sbatch", "--parsable", "-N1", "-w", _heartbeat(run_dir, 0)["node"], "-p", "training", "-q", "training",
         "-A", "training", "-t", "1", "--mem=200G", "-o", "/dev/null", "--wrap", "sleep 2"],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    # Second allocation: after its resume, kill rank 1 between two checkpoints.
    deadline = time.monotonic() + 300
    while True:
        events = [r for r in step_records_all(run_dir) if r.get("event")]
        resumes = [r for r in events if r["event"] == "resume"]
        h = _heartbeat(run_dir, 1)
        fresh = resumes and h.get("phase") == "step" and h["time"] > resumes[0]["time"]
        if fresh and h["step"] > resumes[0]["step"] + 3 and 4 <= h["step"] % 25 <= 21:
            break
        # The preemption must land mid-run, else no step of the second
        # allocation is left to kill a rank in (what CI once saw, unexplained).
        late = [r for r in events if r["event"] == "preempted" and r["step"] > 60]
        assert not late and time.monotonic() < deadline, (
            "no second allocation to kill a rank in", node, h.get("node"), h.get("phase"), h.get("step"),
            [(r["event"], r.get("step"), round(r.get("time", 0) % 1000, 1)) for r in events],
            subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r %N"], capture_output=True, text=True).stdout,
        )  # fmt: skip
        time.sleep(0.1)
    os.kill(h["pid"], 9)
    wait_ended(job, 400)
    out = fleet(str(runs), "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["runs"]
    g = json.loads((run_dir / "goodput.json").read_text())
    assert (
        g["final"] and g["state"] == "COMPLETED" and g["restarts"] == 2 and g["requeues"]["preemptions"] == 1
    ), g  # two starts after the first: the requeue after the preemption, the restart after the kill
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    assert any(f.get("action") == "restart" for f in faults), faults
    # A fault is a failure record; "resumed" lines say when one was recovered.
    failures = [f for f in faults if f.get("event") != "resumed"]
    assert row["faults"] == len(failures) and row["restarts"] == 2, row
    allocated = sacct_gpu_seconds(job)
    total = sum(g["buckets_gpu_s"].values())
    # sacct keeps whole seconds (End truncated); the batch script's teardown
    # ends the last allocation on its own clock, up to a second later than
    # sacct's End says: allow that second on every GPU beside the 2%.
    slack = 0.02 * allocated + 1.0 * g["gpus"]
    assert abs(total - allocated) <= slack, (total, allocated, g["buckets_gpu_s"])
    assert total == pytest.approx(g["allocated_gpu_s"], rel=1e-6)  # the buckets cover the allocation exactly
    counts = Counter(r["step"] for r in step_records(run_dir))
    redone = sum(n - 1 for n in counts.values() if n > 1)
    assert redone > 0 and g["steps"]["redone"] == redone, (g["steps"], redone)
    assert g["steps"]["reached"] == 90, g["steps"]
    b = g["buckets_gpu_s"]
    assert b["redone"] > 0 and b["hang_restart"] > 0 and b["restore"] > 0, b
    print("\ngoodput of the run preempted once and losing a rank once (GPU-seconds):")
    for k, v in b.items():
        print(f"  {k:17s} {v:8.1f}  {100 * v / g['allocated_gpu_s']:5.1f}%")
    print(
        f"  allocated {g['allocated_gpu_s']:.1f} (sacct {allocated:.1f}), queue wait {g['queue_wait_s']:.1f} s, "
        f"ETTR {100 * g['ettr']:.1f}%, redone steps {g['steps']['redone']}, faults {len(faults)}"
    )


def step_records_all(run_dir: Path) -> list[dict]:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for x in lines:
        try:
            out.append(json.loads(x))
        except ValueError:
            continue
    return out


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
    # The batch script wrote the final goodput.json at the job's end: nobody ran fleet yet.
    g = json.loads((runs / "done" / "goodput.json").read_text())
    assert g["final"] is True and g["finalised_by"] == "batch script" and g["state"] == "COMPLETED", g
    assert g["job_id"] == done and g["steps"]["reached"] == 5, g
    assert sum(g["buckets_gpu_s"].values()) == pytest.approx(g["allocated_gpu_s"], rel=0.02), g
    # Its end is "now" in the teardown: within a few seconds of sacct's.
    assert abs(g["allocated_gpu_s"] - sacct_gpu_seconds(done)) <= 2 * 10, (
        g["allocated_gpu_s"],
        sacct_gpu_seconds(done),
    )
    st = subprocess.run(
        [sys.executable, "-m", "launcher.status", str(runs / "done")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    head, row = (line.split() for line in st.stdout.splitlines()[:2])
    # The view may refine goodput.json once from sacct's End (written a second
    # before it): status shows what goodput.json says after it.
    g = json.loads((runs / "done" / "goodput.json").read_text())
    assert row[head.index("ETTR")] == f"{100 * g['ettr']:.1f}%", st.stdout  # final: read back
    view = json.loads(fleet(str(runs), "--json").stdout)
    per_qos = {g["qos"]: g["gpu_hours"] for g in view["totals"]["qos"]}
    for qos, jid in (("research", done), ("inference", job)):
        assert per_qos[qos] == pytest.approx(sacct_gpu_seconds(jid) / 3600, rel=0.01, abs=1e-6), (
            qos,
            per_qos,
        )
    assert per_qos["research"] > 0, per_qos
    assert view["scheduler_calls"] == 1, view["scheduler_calls"]  # nothing pending now: sacct only
