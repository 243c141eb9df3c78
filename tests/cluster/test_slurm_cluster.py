"""Integration tests against the real local Slurm cluster (scripts/testcluster.sh).

Jobs are small (tiny model, CPU ranks with gloo, 1-2 minute limits); the
tests run one after another so preemption is deterministic.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import cluster_base, events, job_id_from, launch, losses, wait_jobs, wait_step
from runviews import assert_views_agree

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]

# Small jobs; 3-minute limits leave room on a loaded 2-core CI machine.
BASE = cluster_base(time_limit_min=3)
SMALL = [*BASE, "cluster.nodes=1", "cluster.gpus_per_node=2"]


def test_two_nodes_two_tasks_rank_env_and_training(tmp_path: Path) -> None:
    """A 2-node x 2-task job trains to completion; every rank saw its rank,
    local rank, world size and the rendezvous address of the first node."""
    from launcher.config import ncclenv as nccl
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.slurm.render import task_command
    from launcher.slurm.submit import _submit

    run_dir = tmp_path / "run"
    cfg = compose([*BASE, "cluster.nodes=2", "cluster.gpus_per_node=2", "train.steps=10"])
    nccl.apply(cfg.cluster)
    spec = RunSpec(cfg, make_plan(cfg), str(run_dir))
    from launcher.run.rundir import write_run_dir

    write_run_dir(spec)
    probe = (
        "import json, os; from train.parallel.dist import dist_info_from_env as d; i = d('cpu'); "
        "print('RANKINFO ' + json.dumps(dict(rank=i.rank, local=i.local_rank, world=i.world_size, "
        "node=i.node_rank, addr=i.master_addr, port=i.master_port, nodename=os.environ['SLURMD_NODENAME'])))"
    )
    command = (
        f"bash -c {json.dumps(f'{sys.executable} -c {json.dumps(probe)} && exec ' + task_command(spec))}"
    )
    job = _submit(spec, run_dir / "slurm", command)
    rec = wait_jobs([job], 150)[job]
    assert rec.state == "COMPLETED", (rec, (run_dir / "slurm" / f"{job}_0_log.err").read_text()[-2000:])
    infos = []
    for t in range(4):
        text = (run_dir / "slurm" / f"{job}_{t}_log.out").read_text()
        infos.append(json.loads(text.split("RANKINFO ", 1)[1].splitlines()[0]))
    infos.sort(key=lambda i: i["rank"])
    assert [i["rank"] for i in infos] == [0, 1, 2, 3]
    assert [i["local"] for i in infos] == [0, 1, 0, 1]
    assert [i["node"] for i in infos] == [0, 0, 1, 1]
    assert {i["world"] for i in infos} == {4}
    # Two nodes, ranks 0-1 on the first: which two depends on the shared cluster's load.
    names = [i["nodename"] for i in infos]
    assert names[0] == names[1] != names[2] == names[3] and names[0] < names[2], names
    # The first node's NodeAddr, and one port for all ranks derived from the job id.
    from launcher.slurm.nodestate import node_info

    assert {i["addr"] for i in infos} == {node_info(names[0])["NodeAddr"]}
    assert {i["port"] for i in infos} == {20000 + int(job) % 20000}
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["final_step"] == 10


def test_sweep_returns_at_once_and_completes(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    t0 = time.monotonic()
    out = launch(
        "-m",
        *BASE,
        "cluster.nodes=1",
        "cluster.gpus_per_node=2",
        "train.steps=5",
        "train.lr=0.001,0.002",
        "parallelism.tp=1,2,3",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    elapsed = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    assert elapsed < 30, f"sweep submission took {elapsed:.1f} s"
    manifest = json.loads((sweep / "manifest.json").read_text())
    points = manifest["points"]
    assert len(points) == 6
    invalid = [p for p in points if p["status"] == "invalid"]
    submitted = [p for p in points if p["status"] == "submitted"]
    assert len(invalid) == 2 and all("parallelism.tp=3" in p["reason"] for p in invalid)
    assert all("job_id" not in p for p in invalid)
    assert len(submitted) == 4 and len({p["array"] for p in submitted}) == 1  # one job array
    assert "invalid: parallelism.tp=3" in out.stdout
    assert "4 submitted in 1 job array(s)" in out.stdout and "2 invalid; 0 failed" in out.stdout
    ids = [p["job_id"] for p in submitted]
    recs = wait_jobs(ids, 200)
    assert all(r.state == "COMPLETED" for r in recs.values()), recs
    for p in submitted:
        assert json.loads((Path(p["run_dir"]) / "result.json").read_text())["status"] == "completed"
    status = subprocess.run(
        [sys.executable, "-m", "launcher.status", str(sweep)], capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stderr
    rows = [line for line in status.stdout.splitlines() if "COMPLETED" in line]
    assert len(rows) == 4
    assert all(" 5/5 " in row for row in rows)  # last step from metrics.jsonl, of train.steps


def test_cancel_checkpoints_and_is_not_requeued(tmp_path: Path) -> None:
    """scancel of a running job: SIGTERM, the ranks save a checkpoint (the
    work is kept), and the batch script, asking Slurm, sees a cancelled job
    and does not requeue it."""
    from train.checkpoint import complete_checkpoints

    run_dir = tmp_path / "run"
    out = launch(
        *SMALL, "train.steps=100000", "train.log_every_steps=5", f"launcher.run_dir={run_dir}", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    job = job_id_from(out.stdout)
    wait_step(run_dir, 10, 180)
    cancel = subprocess.run(
        [sys.executable, "-m", "launcher.status", "cancel", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cancel.returncode == 0 and f"job {job}" in cancel.stdout, cancel.stderr
    assert wait_jobs([job], 60)[job].state == "CANCELLED"
    _wait_gone(job, 90)  # COMPLETING until the ranks and the batch script exit
    time.sleep(5)  # a requeued job would be PENDING again by now
    assert _squeue_state(job) == "", "the cancelled job came back"
    rec = wait_jobs([job], 30)[job]
    assert rec.state == "CANCELLED" and rec.restarts == 0, rec
    stopped = events(run_dir, "preempted")
    assert stopped and stopped[0]["signal"] == "SIGTERM", stopped
    step = stopped[0]["step"]
    assert step >= 10 and step in [s for s, _ in complete_checkpoints(run_dir / "checkpoints")]
    assert not (run_dir / "requeues.log").exists()
    batch_log = (run_dir / "slurm" / f"{job}_0_log.out").read_text()
    assert "is COMPLETING (cancelled, or past its limit): not requeueing" in batch_log, batch_log[-2000:]
    status = subprocess.run(
        [sys.executable, "-m", "launcher.status", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert "CANCELLED" in status.stdout


def _squeue_state(job: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30
    ).stdout.strip()


def _wait_gone(job: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _squeue_state(job):
        assert time.monotonic() < deadline, f"job {job} still in squeue: {_squeue_state(job)}"
        time.sleep(1)


def test_bad_requests_fail_before_submission(tmp_path: Path) -> None:
    cases = {
        "qos.partition=nosuch": "no such partition",
        "qos.qos=nosuch": "no such QOS",
        "qos.account=nosuch": "has no association",
        "cluster.gpus_per_node=16": "must be <= cluster.node_gpus=8",  # the preset says what a node has
        "qos.time_limit_min=5000": "allows 1440 minutes",
    }
    for override, message in cases.items():
        run_dir = tmp_path / override.split("=")[0]
        out = launch(*SMALL, override, f"launcher.run_dir={run_dir}", cwd=tmp_path)
        assert out.returncode != 0 and message in out.stderr, (override, out.stderr)
        assert not run_dir.exists()  # refused before the run dir was written
    # Over the research QOS's GPU share (12 of 32): exclusive 2 nodes = 16 GPUs.
    out = launch(*BASE, "cluster.nodes=2", "launcher.exclusive=true", cwd=tmp_path)
    assert out.returncode != 0 and "limit GrpTRES gres/gpu=12" in out.stderr, out.stderr


def _slurm_config() -> str:
    return subprocess.run(
        ["scontrol", "show", "config"], check=True, capture_output=True, text=True, timeout=30
    ).stdout


def test_preempted_job_resumes_with_identical_losses(tmp_path: Path) -> None:
    """A research job preempted by a training-QOS job checkpoints on USR2, is
    requeued from the batch script, resumes and matches an uninterrupted run."""
    common = [
        *BASE,
        "cluster.nodes=1",
        "cluster.gpus_per_node=2",
        "train.steps=120",
        "train.log_every_steps=5",
    ]
    victim_dir, ref_dir = tmp_path / "victim", tmp_path / "ref"
    # Most of a node's memory (a shared node is asked in proportion now): the
    # preemptor's 200 GB fits its node only once the victim is gone.
    out = launch(*common, "launcher.mem_gb=200", f"launcher.run_dir={victim_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    victim = job_id_from(out.stdout)
    # The reference runs under the training QOS, which nobody here preempts.
    out = launch(*common, "qos=training", "qos.time_limit_min=4", f"launcher.run_dir={ref_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    ref = job_id_from(out.stdout)
    wait_step(victim_dir, 10, 120)
    # The victim's node's memory for a training-QOS job: only preempting the
    # victim frees it (pinned to that node: other jobs share the cluster).
    node = subprocess.run(
        ["squeue", "-h", "-j", victim, "-o", "%N"], check=True, capture_output=True, text=True, timeout=30
    ).stdout.strip()
    t_preempt = time.time()
    subprocess.run(
        ["sbatch", "--parsable", "-N1", "-w", node, "-p", "training", "-q", "training", "-A", "training",
         "-t", "1", "--mem=200G", "-o", "/dev/null", "--wrap", "sleep 2"],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    recs = wait_jobs([victim, ref], 240)
    assert recs[victim].state == "COMPLETED" and recs[ref].state == "COMPLETED", recs
    assert recs[victim].restarts >= 1
    resumes = events(victim_dir, "resume")
    assert resumes and resumes[0]["step"] > 0, "the victim did not resume from a checkpoint"
    preempted = events(victim_dir, "preempted")
    # Without send_user_signal (the test cluster's default) Slurm sends SIGTERM.
    expected = "SIGUSR2" if "preempt_send_user_signal" in _slurm_config() else "SIGTERM"
    assert preempted and preempted[0]["signal"] == expected, preempted
    # The batch script asked Slurm and recorded a preemption, not a failure.
    causes = [line.split()[2] for line in (victim_dir / "requeues.log").read_text().splitlines()]
    assert causes == ["preemption"], causes
    assert resumes[0]["requeues"] == {"preemptions": 1, "time_limits": 0, "failures": 0}, resumes
    resumed = [json.loads(x) for x in (victim_dir / "metrics.jsonl").read_text().splitlines()]
    t_resume = next(r["time"] for r in resumed if r.get("event") == "resume")
    print(f"\npreemption -> resumed training: {t_resume - t_preempt:.1f} s")
    assert json.loads((victim_dir / "result.json").read_text())["final_step"] == 120
    a, b = losses(victim_dir), losses(ref_dir)
    after = [s for s in a if s > resumes[0]["step"] and s in b]  # steps both runs logged
    assert after and all(abs(a[s] - b[s]) <= 1e-6 * max(1.0, abs(b[s])) for s in after), (a, b)
    # The trainer across a preemption's requeue: status, fleet, the page, the API and goodput.json agree.
    g = assert_views_agree(victim_dir, tmp_path, [victim], state="COMPLETED", step=120)["goodput"]
    assert g["restarts"] >= 1, g


# Its first allocation mostly sleeps: the session's third-party venvs build meanwhile.
@pytest.mark.usefixtures("venvs_start")
def test_time_limit_requeues_and_finishes(tmp_path: Path) -> None:
    """qos=training defaults (GraceTime 300 s) with a USR2 lead shorter than
    half the grace time: the ranks checkpoint, wait no longer than the lead
    minus the margin (not half the grace time, 150 s, as before: past the
    120 s lead), exit, and the batch script requeues before the kill; the job
    resumes and finishes. A 2-minute limit keeps it short; it cannot hold the
    planned 120 s lead (refused as typed), so the lead is set to 60 s while
    the grace time stays the preset's 300 s, the same order as the real
    defaults (lead 120 s < 150 s)."""
    run_dir = tmp_path / "run"
    # The first allocation sleeps 1 s a step (tests/faultinject): at most ~80
    # steps before its USR2 (60-90 s in: the 60 s lead, slurmctld checks
    # every 30 s), so it always requeues; the second runs the rest of the 150
    # at full speed (45-100 ms a step; 190 fitted in one on a loaded host): two
    # allocations, about 2.5 minutes.
    # (2,000 unslowed steps took 403 s of CI's time in three allocations, and
    # up to eight on a loaded machine, where start-up eats most of each.)
    inject = str(ROOT / "tests" / "faultinject")
    env = {
        "MESHRUN_TEST_STEP_SLEEP_S": "1.0",
        "PYTHONPATH": os.pathsep.join([inject, *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    out = launch(
        "cluster=testcluster", "model=tiny", "launcher.exclusive=false", "cluster.nodes=1",
        "cluster.gpus_per_node=2", "qos=training", "qos.time_limit_min=2", "launcher.signal_lead_s=60",
        "train.steps=150", "train.log_every_steps=25", "storage.save_every_steps=50",
        # The collective sampler stays on (default): it profiles one step and
        # reads the trace off the loop, so it cannot delay the USR2 past the
        # kill (it used to profile the whole 50-step interval and block the
        # loop 50-110 s parsing it).
        f"launcher.run_dir={run_dir}", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    job = job_id_from(out.stdout)
    assert "#SBATCH --signal=USR2@60" in (run_dir / "slurm" / f"{job}_submission.sh").read_text()
    rec = wait_jobs([job], 1200)[job]
    assert rec.state == "COMPLETED", rec
    stop = events(run_dir, "preempted")[0]
    # The end-of-job wait fits in the lead (60 s) minus the margin (10 s).
    assert stop["signal"] == "SIGUSR2" and 0 <= stop["wait_budget_s"] <= 60 - 10, stop
    causes = [line.split()[2] for line in (run_dir / "requeues.log").read_text().splitlines()]
    assert causes and set(causes) == {"time_limit"}, causes
    resumes = events(run_dir, "resume")
    assert resumes and resumes[0]["requeues"]["failures"] == 0, resumes
    assert json.loads((run_dir / "result.json").read_text()) == {
        **json.loads((run_dir / "result.json").read_text()),
        "final_step": 150,
        "status": "completed",
    }


def test_failing_rank_ends_the_job_and_is_named(tmp_path: Path) -> None:
    """A rank that raises at step 5 (the real trainer, a fault injected in
    its step function): srun --kill-on-bad-exit ends the step and the job
    within 30 s, non-zero, and the job's log names the rank."""
    from launcher.config import ncclenv as nccl
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.run.rundir import write_run_dir
    from launcher.slurm.submit import _submit

    run_dir = tmp_path / "run"
    # No restarts: the supervisor (launcher/selfheal/supervisor.py) records the
    # fault and gives up at once (tests/cluster/test_selfheal.py covers restarts).
    cfg = compose(
        [*SMALL, "train.steps=100000", "train.log_every_steps=1", "launcher.max_restarts=0"]
        + [f"launcher.runs_root={tmp_path}"]
    )
    nccl.apply(cfg.cluster)
    spec = RunSpec(cfg, make_plan(cfg), str(run_dir))
    write_run_dir(spec)
    inject = (
        "import os, sys, train.loop.step as s\n"
        "real, n = s.train_step, [0]\n"
        "def step(*a, **k):\n"
        "    n[0] += 1\n"
        "    if os.environ['SLURM_PROCID'] == '1' and n[0] == 5:\n"
        "        raise RuntimeError('injected failure at step 5')\n"
        "    return real(*a, **k)\n"
        "s.train_step = step\n"
        "from train.__main__ import main\n"
        "raise SystemExit(main(sys.argv))\n"
    )
    command = f"{sys.executable} -u -c {shlex.quote(f'exec({inject!r})')} {run_dir}"
    job = _submit(spec, run_dir / "slurm", command)
    rec = wait_jobs([job], 300)[job]
    ended = time.time()
    assert rec.state == "FAILED" and rec.exit_code != "0:0", rec
    first = (run_dir / "failures.log").read_text().splitlines()[0]
    assert f"{job} 0 rank 1 " in first and "injected failure at step 5" in first, first
    failed_at = float(first.split()[4].rstrip(":"))
    # wait_jobs polls every 2 s: the job ended at most that much before `ended`.
    assert ended - failed_at <= 30 + 2, f"job ended {ended - failed_at:.1f} s after rank 1 failed"
    batch_err = (run_dir / "slurm" / f"{job}_0_log.err").read_text()
    line = next(
        (x for x in batch_err.splitlines() if x.startswith(f"meshrun: job {job} failed (srun exit ")), ""
    )
    assert "): rank 1 " in line and "injected failure at step 5" in line, batch_err[-2000:]
    fault = json.loads((run_dir / "faults.jsonl").read_text().splitlines()[0])
    assert fault["cause"] == "error" and fault["action"] == "give up", fault
    assert "injected failure at step 5" in fault["error"] and fault["evidence"]["first_rank"] == 1
    print(f"\nrank failure -> job ended: {ended - failed_at:.1f} s")


def test_preflight_runs_first_and_a_failing_node_stops_the_job(tmp_path: Path) -> None:
    """A node that fails preflight is a fault (faults.jsonl, the runs root's
    ledger): with a spare, training starts without it; without one, the job
    ends before training."""
    from launcher.config import nodeledger
    from launcher.config.health import read_faults, read_heartbeats

    # The test cluster's nodes advertise 256 GB on a small host: describe the
    # RAM honestly so only the scratch check can fail a node.
    common = [*SMALL, "cluster.preflight=true", "cluster.mem_per_node_gb=8", "train.steps=5"]
    good, bad = tmp_path / "good", tmp_path / "bad"
    # One node and a spare; the first node's disks look full (tests/faultinject).
    inject = {
        "MESHRUN_TEST_FULL_DISK_NODEID": "0",
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "tests" / "faultinject"), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    p1 = launch(*common, "cluster.spare_nodes=1", f"launcher.run_dir={good}", cwd=tmp_path, env=inject)
    p2 = launch(*common, "cluster.preflight_min_free_gb=1e9", f"launcher.run_dir={bad}", cwd=tmp_path)
    assert p1.returncode == 0 and p2.returncode == 0, p1.stderr + p2.stderr
    ids = [job_id_from(p1.stdout), job_id_from(p2.stdout)]
    recs = wait_jobs(ids, timeout=240)
    ledger = nodeledger.read(tmp_path / "runs" / nodeledger.LEDGER_FILE)

    assert recs[ids[0]].state == "COMPLETED", (good / "slurm").glob("*_log.err")
    assert json.loads((good / "result.json").read_text())["status"] == "completed"
    reports = {p.stem: json.loads(p.read_text()) for p in (good / "preflight").glob("node*.json")}
    assert len(reports) == 2, reports  # one preflight task per node, each ran to the end
    failed = [n for n, d in reports.items() if any(c["status"] == "fail" for c in d["checks"])]
    assert len(failed) == 1, reports
    (fault,) = [f for f in read_faults(good) if "event" not in f]
    assert (fault["cause"], fault["node"], fault["action"]) == ("preflight", failed[0], "exclude"), fault
    assert fault["evidence"]["failed"][0]["name"] == "scratch" and "0.0 GB free" in fault["error"], fault
    assert [(r["node"], r["cause"]) for r in ledger if r["run_dir"] == str(good)] == [
        (failed[0], "preflight")
    ]
    assert json.loads((good / "preflight" / "allreduce.json").read_text())["check"]["status"] == "pass"
    trained_on = {h["node"] for h in read_heartbeats(good).values()}
    assert trained_on and failed[0] not in trained_on, trained_on  # the spare trained

    assert recs[ids[1]].state == "FAILED"
    assert not (bad / "metrics.jsonl").exists()  # training never started
    out = "".join(p.read_text() for p in (bad / "slurm").glob("*_log.*"))
    assert "scratch     FAIL" in out
    assert "preflight failed: training not started" in out
    (fault,) = read_faults(bad)
    assert (fault["cause"], fault["action"]) == ("preflight", "stop: too few nodes"), fault
    assert [r["node"] for r in ledger if r["run_dir"] == str(bad)] == [fault["node"]]
