"""Reproducible runs on the real local Slurm test cluster (scripts/testcluster.sh):
code snapshots (across a hold, a requeue and a sweep's points started apart),
the run record, rerun, diff, run dependencies and a pipeline killed at its
first stage, in one scenario of tiny jobs running side by side
(docs/reproducibility.md).

The code source is a COPY of this checkout (a git repository of its own),
so editing it to raise at import breaks no other test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import wait_jobs

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]

SMALL = [
    "cluster=testcluster",
    "model=tiny",
    # Not preemptible (other tests on the shared cluster preempt research jobs,
    # which would restart a and break its bitwise comparison with b).
    "qos=training",
    "launcher.exclusive=false",
    # A few cores and GB each, not the whole node: the scenario's jobs run side by side.
    "launcher.cpus_per_task=1",
    "launcher.mem_gb=4",
    "qos.time_limit_min=3",
    "launcher.signal_lead_s=30",
    "cluster.nodes=1",
    "cluster.gpus_per_node=2",
    "train.steps=6",
    "train.log_every_steps=1",
    "storage.save_every_steps=1000",
    "train.checkpoint_at_end=false",
]
# The jobs added for the requeue, the sweep and the pipeline: one rank each
# (the machine has few cores; what they prove does not need two).
ONE = [*SMALL, "cluster.gpus_per_node=1"]
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
    return {j: r.state for j, r in wait_jobs(ids, timeout, DONE).items()}


def losses(run_dir: Path) -> list[tuple[int, float]]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in recs if "loss" in r and "event" not in r]


def record(run_dir: Path | str) -> dict:
    return json.loads((Path(run_dir) / "run_record.json").read_text())


def steps_logged(run_dir: Path) -> int:
    try:
        return len(losses(run_dir))
    except (OSError, ValueError):
        return 0  # not started, or a line being written


def queue_state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def when_ready(actions: dict[str, tuple], timeout: float) -> None:
    """Run each action once its condition holds, all polled together (the
    jobs they watch run side by side)."""
    deadline = time.monotonic() + timeout
    while actions:
        for name, (ready, act) in list(actions.items()):
            if ready():
                act()
                del actions[name]
        assert time.monotonic() < deadline, f"never ready: {sorted(actions)}"
        time.sleep(1)


PIPELINE = """
overrides: {common}
stages:
  pretrain:
    overrides: [launcher.hold=true, train.steps=20, storage.save_every_steps=2]
  eval:
    overrides: [job=eval, "job.checkpoint={{run:pretrain}}", job.eval_batches=1]
    depends_on: [pretrain]
  export:
    overrides: [job=finetune, "job.checkpoint={{run:pretrain}}", "job.export_hf={{run:pretrain}}/hf"]
    depends_on: [pretrain, eval]
"""


def test_snapshot_requeue_sweep_pipeline_rerun_diff(tmp_path: Path) -> None:
    src, work = tmp_path / "src", tmp_path / "work"
    work.mkdir()
    copy_checkout(src)
    a, b, c, f, d = (tmp_path / n for n in "abcfd")
    sweep, pipe = tmp_path / "sweep", tmp_path / "pipe"
    jobs: list[str] = []
    try:
        # a: submitted held (launcher.hold: sbatch --hold), with the committed code.
        p = meshrun(src, work, "launcher", *SMALL, "launcher.hold=true", f"launcher.run_dir={a}")
        job_a = submitted(p)
        jobs.append(job_a)
        assert "code: snapshot " in p.stdout and ", clean)" in p.stdout, p.stdout
        assert "JobHeldUser" in scontrol(job_a) or "Priority=0" in scontrol(job_a), scontrol(job_a)
        # A sweep of two points (one job array), held, with the committed code:
        # point 1 starts after point 0 did and the checkout was edited again, and
        # is requeued while it trains after a further edit (0.5 s a step:
        # tests/faultinject, so it is still training then).
        inject = {"PYTHONPATH": f"{src}:{ROOT / 'tests' / 'faultinject'}", "MESHRUN_TEST_STEP_SLEEP_S": "0.5"}
        p = meshrun(
            src, work, "launcher", "-m", *ONE, "train.steps=12", "launcher.hold=true", "train.lr=0.003,0.002",
            f"hydra.sweep.dir={sweep}", env=inject,
        )  # fmt: skip
        assert p.returncode == 0 and "2 submitted in 1 job array(s)" in p.stdout, p.stdout + p.stderr
        points = json.loads((sweep / "manifest.json").read_text())["points"]
        array, point_jobs = points[0]["array"], [pt["job_id"] for pt in points]
        jobs.append(array)
        # A pipeline pretrain -> eval of each checkpoint -> HF export; stage 1 held, then killed
        # for good (a running job's scancel is final: test_slurm_cluster.py).
        (tmp_path / "pipe.yaml").write_text(PIPELINE.format(common=json.dumps(ONE)))
        p = meshrun(src, work, "launcher.cli", "pipeline", str(tmp_path / "pipe.yaml"), "--dir", str(pipe))
        assert p.returncode == 0, p.stdout + p.stderr
        stage = {s["stage"]: s["job_id"] for s in json.loads((pipe / "pipeline.json").read_text())["stages"]}
        jobs += stage.values()
        deps = {n: re.search(r"Dependency=(\S+)", scontrol(stage[n])).group(1) for n in ("eval", "export")}
        assert re.fullmatch(rf"afterok:{stage['pretrain']}\(unfulfilled\)", deps["eval"]), deps
        assert {f"afterok:{stage[n]}(unfulfilled)" for n in ("pretrain", "eval")} == set(
            deps["export"].split(",")
        ), deps
        subprocess.run(["scancel", stage["pretrain"]], check=True)
        # c: one edited file and another lr, waiting for a (afterok).
        report = src / "launcher" / "views" / "planreport.py"
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
        subprocess.run(["scontrol", "release", f"{job_a},{job_f},{array}_0"], check=True)
        edited: list[float] = []
        job_b: list[str] = []

        def edit(why: str) -> None:
            entry.write_text(entry.read_text() + f'raise RuntimeError("edited {why}")\n')
            edited.append(time.time())

        def rerun_a() -> None:
            # b: rerun of a (the checkout still raises): the same snapshot.
            p = meshrun(
                src, work, "launcher.cli", "rerun", str(a), "launcher.hold=false", f"launcher.run_dir={b}"
            )
            job_b.append(submitted(p))
            jobs.append(job_b[0])

        when_ready(
            {
                "point 1": (
                    lambda: bool(record(points[0]["run_dir"]).get("attempts")),
                    lambda: (
                        edit("between the sweep points"),
                        subprocess.run(["scontrol", "release", point_jobs[1]], check=True),
                    ),
                ),
                "requeue": (
                    lambda: steps_logged(Path(points[1]["run_dir"])) >= 2,
                    lambda: (
                        edit("before the requeue"),
                        subprocess.run(["scontrol", "requeue", point_jobs[1]], check=True),
                    ),
                ),
                "rerun": (lambda: queue_state(job_a) == "" and (a / "result.json").exists(), rerun_a),
            },
            300,
        )
        states = wait([job_a, job_c, job_f, job_d, *job_b, *point_jobs, *stage.values()], 420)
        assert states == {
            job_a: "COMPLETED",
            job_c: "COMPLETED",
            job_f: "FAILED",
            job_d: "CANCELLED",
            job_b[0]: "COMPLETED",
            **dict.fromkeys(point_jobs, "COMPLETED"),
            **dict.fromkeys(stage.values(), "CANCELLED"),
        }, states
        assert "edited checkout" in (f / "slurm" / f"{job_f}_0_log.err").read_text()
        # The job recorded the snapshot it ran (its own view at start).
        rec = record(a)
        start = rec["attempts"][0]
        assert start["job_id"] == job_a and start["code_dir"] == rec["code"]["dir"] != str(src)
        assert start["code_digest"] == rec["code"]["digest"] and "torch" in start["packages"]
        assert rec["code"]["git"]["dirty"] is False and len(rec["code"]["git"]["commit"]) == 40
        # The sweep: point 1 started after an edit and restarted after a further
        # one (the requeue), and each start imported the submitted code, byte for
        # byte (the digest of the snapshot it imported): the edits had no effect.
        starts = [record(pt["run_dir"])["attempts"] for pt in points]
        assert [s["restart"] for s in starts[1]] == [0, 1], starts[1]
        assert starts[0][0]["time"] < edited[0] < starts[1][0]["time"] < edited[1] < starts[1][1]["time"], (
            starts,
            edited,
        )
        assert {(s["code_dir"], s["code_digest"]) for run in starts for s in run} == {
            (rec["code"]["dir"], rec["code"]["digest"])  # a's: the same committed code
        }, starts
        assert json.loads((Path(points[1]["run_dir"]) / "result.json").read_text())["final_step"] == 12
        # The pipeline: Slurm cancelled the stages after the killed one, and status says why.
        status = meshrun(src, work, "launcher.status", str(pipe))
        killed = f"job {stage['pretrain']} ({pipe / 'pretrain'}) ended CANCELLED"
        lines = [ln for ln in status.stdout.splitlines() if "cancelled by Slurm" in ln]
        assert len(lines) == 2 and lines[0].startswith("eval: ") and lines[1].startswith("export: "), (
            status.stdout
        )
        assert all(killed in ln for ln in lines), status.stdout
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
        # b, the rerun of a: a bitwise-equal loss curve.
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
            "code: launcher/views/planreport.py (changed)",
            "meshrun diff: 2 difference(s): config 1, code 1",
        ], other.stdout
    finally:
        for job in jobs:
            subprocess.run(["scancel", job], capture_output=True)
