"""Reproducible runs on the real local Slurm test cluster (scripts/testcluster.sh):
code snapshots, the run record, rerun, diff and run dependencies, in one
scenario of five tiny jobs (docs/reproducibility.md).

The code source is a COPY of this checkout (a git repository of its own),
so editing it to raise at import breaks no other test.
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

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]

SMALL = [
    "cluster=testcluster",
    "model=tiny",
    "launcher.exclusive=false",
    "qos.time_limit_min=3",
    "launcher.signal_lead_s=30",
    "cluster.nodes=1",
    "cluster.gpus_per_node=2",
    "train.steps=6",
    "train.log_every_steps=1",
    "storage.save_every_steps=1000",
    "train.checkpoint_at_end=false",
]
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")


def copy_checkout(dst: Path) -> None:
    """The packages a job runs, in a git repository of their own (one commit)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("launcher", "train", "hydra_plugins", "conf"):
        shutil.copytree(ROOT / name, dst / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    git = ["git", "-C", str(dst), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "copy"], check=True)


def meshrun(
    src: Path, cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A command of the copied code (its own launcher), as a user types it."""
    full = {**os.environ, "PYTHONPATH": str(src), "PYTHONSAFEPATH": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=full
    )


def submitted(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 0, p.stdout + p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("meshrun: submitted job "))
    return line.split()[3].rstrip(":")


def scontrol(job: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout


def wait(ids: list[str], timeout: float) -> dict[str, str]:
    from launcher.slurm.cluster import jobs

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recs = jobs(ids)
        if len(recs) == len(ids) and all(r.state in DONE for r in recs.values()):
            return {j: r.state for j, r in recs.items()}
        time.sleep(3)
    raise AssertionError(f"jobs {ids} not done after {timeout} s: {jobs(ids)}")


def losses(run_dir: Path) -> list[tuple[int, float]]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in recs if "loss" in r and "event" not in r]


def test_snapshot_rerun_diff_and_dependencies(tmp_path: Path) -> None:
    src, work = tmp_path / "src", tmp_path / "work"
    work.mkdir()
    copy_checkout(src)
    a, b, c, f, d = (tmp_path / n for n in "abcfd")
    jobs: list[str] = []
    try:
        # a: submitted held (launcher.hold: sbatch --hold), with the committed code.
        p = meshrun(src, work, "launcher", *SMALL, "launcher.hold=true", f"launcher.run_dir={a}")
        job_a = submitted(p)
        jobs.append(job_a)
        assert "code: snapshot " in p.stdout and ", clean)" in p.stdout, p.stdout
        assert "JobHeldUser" in scontrol(job_a) or "Priority=0" in scontrol(job_a), scontrol(job_a)
        # c: one edited file and another lr, waiting for a (afterok).
        report = src / "launcher" / "ops" / "report.py"
        report.write_text(report.read_text() + "# edited for run c\n")
        p = meshrun(
            src, work, "launcher", *SMALL, "train.lr=0.001", f"launcher.after={a}", f"launcher.run_dir={c}"
        )
        job_c = submitted(p)
        jobs.append(job_c)
        assert f"Dependency=afterok:{job_a}" in scontrol(job_c), scontrol(job_c)
        # The checkout now raises at import: a runs its snapshot regardless;
        # f runs the live checkout (launcher.code=live) and fails; d waits for f.
        entry = src / "train" / "jobs" / "entry.py"
        entry.write_text(entry.read_text() + '\nraise RuntimeError("edited checkout")\n')
        p = meshrun(
            src,
            work,
            "launcher",
            *SMALL,
            "launcher.code=live",
            "launcher.max_restarts=0",
            "launcher.hold=true",
            f"launcher.run_dir={f}",
        )
        job_f = submitted(p)
        jobs.append(job_f)
        assert "code: live" in p.stdout, p.stdout
        job_d = submitted(
            meshrun(src, work, "launcher", *SMALL, f"launcher.after={job_f}", f"launcher.run_dir={d}")
        )
        jobs.append(job_d)
        subprocess.run(["scontrol", "release", f"{job_a},{job_f}"], check=True)
        states = wait([job_a, job_c, job_f, job_d], 420)
        assert states == {job_a: "COMPLETED", job_c: "COMPLETED", job_f: "FAILED", job_d: "CANCELLED"}, states
        assert "edited checkout" in (f / "slurm" / f"{job_f}_0_log.err").read_text()
        # The job recorded the snapshot it ran (its own view at start).
        rec = json.loads((a / "run_record.json").read_text())
        start = rec["attempts"][0]
        assert start["job_id"] == job_a and start["code_dir"] == rec["code"]["dir"] != str(src)
        assert start["code_digest"] == rec["code"]["digest"] and "torch" in start["packages"]
        assert rec["code"]["git"]["dirty"] is False and len(rec["code"]["git"]["commit"]) == 40
        status = meshrun(src, work, "launcher.status", str(d))
        assert (
            f"cancelled by Slurm: a run it depends on failed: job {job_f} ({f}) ended FAILED" in status.stdout
        ), status.stdout + status.stderr
        # A run after a job that already failed is refused, writing nothing.
        late = meshrun(
            src, work, "launcher", *SMALL, f"launcher.after={f}", f"launcher.run_dir={tmp_path / 'late'}"
        )
        assert late.returncode == 2 and f"job {job_f} has already ended FAILED" in late.stderr, late.stderr
        assert not (tmp_path / "late").exists()
        # b: rerun of a (the checkout still raises): the same snapshot, a bitwise-equal loss curve.
        p = meshrun(
            src, work, "launcher.cli", "rerun", str(a), "launcher.hold=false", f"launcher.run_dir={b}"
        )
        job_b = submitted(p)
        jobs.append(job_b)
        assert wait([job_b], 240) == {job_b: "COMPLETED"}
        assert losses(b) == losses(a) and len(losses(a)) == 6
        same = meshrun(src, work, "launcher.cli", "diff", str(a), str(b))
        assert same.returncode == 0, same.stdout + same.stderr
        assert "bitwise equal over 6 logged steps" in same.stdout
        # a vs c: exactly the lr and the edited file.
        other = meshrun(src, work, "launcher.cli", "diff", "--no-code-diff", str(a), str(c))
        assert other.returncode == 1, other.stdout + other.stderr
        named = [ln for ln in other.stdout.splitlines() if not ln.startswith("loss curves:")]
        assert named == [
            "config: train.lr: 0.003 -> 0.001",
            "code: launcher/ops/report.py (changed)",
            "meshrun diff: 2 difference(s): config 1, code 1",
        ], other.stdout
    finally:
        for job in jobs:
            subprocess.run(["scancel", job], capture_output=True)
