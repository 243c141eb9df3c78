"""In-process recovery on the real test cluster (launcher.in_process_recovery
with cluster=testcluster: launcher/selfheal/inprocess.py): meshrun's trainer,
2 nodes x 2 CPU ranks (FSDP over 4) + 1 spare node, through ``python -m
launcher``, every step in the test image through Pyxis + Enroot (the same
without a container: the campaign). Rank 2 (its node's local rank 0: the node's heartbeat writer)
is SIGKILLed mid-run. The warm spare the supervisor holds on the spare node
(a step that loaded torch and the trainer at the start) takes rank 2; the
survivors keep their processes (their gloo connections are shut at the
abort: train/inprocess/sever.py), the replacement gets rank 2's state from
its partner's host memory, every rank rolls back to one step. Once that
recovery is recorded and the taken spare's successor is warm on node 2,
rank 3 is SIGSTOPped (a hang): the survivors' bounded collectives time out,
the store host names rank 3 missing, the supervisor kills it and the warm
spare on its node takes its rank, the same way. The job COMPLETES with the
losses of an uninterrupted run (bitwise: CPU, same seeds), faults.jsonl
holds the trainer's own two in-process records (rank_lost, rank_hung) and
no restart, goodput.json counts two in-process recoveries. The
uninterrupted run is a local one of the same model, batch and seeds
(cluster=local, 4 ranks), beside the job: its losses were checked bitwise
equal to the same run on the test cluster's 2 nodes (30 of 30 steps), and
the job's 3 nodes leave too few for a second job.

Runtime: 51-66 s on the shared 2-core host (200 steps, the wait for the
successor spare included; 59.5 s in each of two full-suite runs).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import TINY_MODEL, cluster_base, heartbeat_at, loss_history, start_local_run, submit, wait_job

from launcher.config.health import read_heartbeats

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]

REPO = Path(__file__).resolve().parents[2]
STEPS, KILL_AT, VICTIM, HUNG = 200, 30, 2, 3
TRAINING = [
    *TINY_MODEL,
    "parallelism=fsdp",
    "parallelism.precision=fp32",
    "train.global_batch_size=4",
    "train.warmup_steps=3",
    "train.log_every_steps=1",
    f"train.steps={STEPS}",
    "storage.save_every_steps=1000",
    "launcher.in_process_recovery=true",
    "launcher.in_process_collective_timeout_s=5",
    # The shared host's node 1 also runs the supervisor and the store host:
    # 200 steps give the straggler rule its 5 probes, and it once named node 1.
    "launcher.straggler=off",
]
COMMON = [
    *cluster_base(time_limit_min=5),
    *TRAINING,
    "cluster.nodes=2",
    "cluster.gpus_per_node=2",
    "launcher.hang_startup_timeout_s=150",
]


def local_reference(run_dir: Path) -> subprocess.Popen:
    """The same training on this machine, 4 local ranks, in the background."""
    return start_local_run(
        run_dir, *TRAINING, "cluster.local_processes=4", "cluster.metrics_port=0", cwd=run_dir.parent
    )


def said(run_dir: Path, job: str, rank: int, gen: int) -> tuple[int, str, int]:
    """(pid, survivor|replacement, step rolled back to) of the rank's recovery line at generation ``gen``."""
    return said_from(run_dir, job, rank, gen, "peer memory")


def said_from(run_dir: Path, job: str, rank: int, gen: int, source: str) -> tuple[int, str, int]:
    text = (run_dir / "slurm" / f"{job}_{rank}_log.err").read_text()
    m = re.search(rf"rank {rank} \(pid (\d+), (survivor|replacement)\): in-process recovery at generation "
                  rf"{gen}: rolled back to step (\d+) from {source}", text)  # fmt: skip
    assert m, (rank, text[-2000:])
    return int(m[1]), m[2], int(m[3])


def test_a_killed_task_is_replaced_on_the_spare_in_process(tmp_path: Path) -> None:
    """In the test image (Pyxis + Enroot), every step: the ranks, the store
    host, the warm spares, the replacements (the steps beside the running
    training step start their own containers: ``--container-name=...:no_exec``)."""
    from testcluster_util import IMAGE, container_overrides

    from launcher.slurm.cluster import pyxis_available

    if not pyxis_available() or not os.path.isfile(IMAGE):
        pytest.skip(f"no Pyxis on the test cluster or no test image {IMAGE} (scripts/testcluster.sh start)")
    run_dir = faults_then_losses(tmp_path, container_overrides())
    # Every process that trained started in the image (its wrapper's proof,
    # one file per job.restart.step.task): the 4 ranks' step, the spare's
    # step on the spare node (rank 2's replacement), its successor's on node 2
    # (rank 3's); no restart. The store host's step too.
    proof = run_dir / "container-proof"
    inside = {p.name: p.read_text() for p in proof.iterdir()} if proof.is_dir() else {}
    ours = {k: v for k, v in inside.items() if v.startswith("meshrun-test-image ")}
    train = sorted(k for k, v in ours.items() if "-m train " in v)
    assert len(train) == 6 and len({k.split(".")[2] for k in train}) == 3, inside
    assert {k.split(".")[1] for k in train} == {"0"}, inside
    assert any("-m train.inprocess.storehost" in v for v in ours.values()), inside


# A campaign (pytest -m campaign): the same faults, no container.
@pytest.mark.campaign
def test_bare_killed_and_hung_tasks_are_replaced_in_process(tmp_path: Path) -> None:
    faults_then_losses(tmp_path, [])


def faults_then_losses(tmp_path: Path, extra: list[str]) -> Path:
    """The job with its two faults beside the uninterrupted reference; its
    losses, every step the last time it ran, equal the reference's, bitwise."""
    run_dir, ref_dir = tmp_path / "run", tmp_path / "ref"
    job = submit(*COMMON, *extra, "cluster.spare_nodes=1", f"launcher.run_dir={run_dir}", cwd=tmp_path)
    ref = local_reference(ref_dir)
    try:
        check(job, run_dir)
        assert ref.wait(timeout=240) == 0, Path(f"{ref_dir}.out").read_text()[-3000:]
    finally:
        if ref.poll() is None:
            os.killpg(ref.pid, signal.SIGKILL)
            ref.wait()
    want, got = dict(loss_history(ref_dir)), dict(loss_history(run_dir))
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    assert got == want
    return run_dir


def check(job: str, run_dir: Path) -> None:
    """The kill and what the job did about it."""
    beats = {r: heartbeat_at(run_dir, r, KILL_AT) for r in range(4)}
    os.kill(beats[VICTIM]["pid"], signal.SIGKILL)
    # Once that recovery is recorded: rank 3 hangs (SIGSTOP).
    faults_file, deadline = run_dir / "faults.jsonl", time.monotonic() + 150
    while '"event": "resumed"' not in (faults_file.read_text() if faults_file.exists() else ""):
        assert time.monotonic() < deadline, "no in-process recovery recorded in 150 s"
        time.sleep(0.2)
    # ... and the taken spare's successor is warm on the node the killed task left.
    sup = run_dir / "slurm" / f"{job}_0_log.err"
    again = run_dir / "slurm" / f"{job}_spare-{beats[VICTIM]['node']}_log.err"
    while "loaded in" not in (again.read_text() if again.exists() else ""):
        assert time.monotonic() < deadline + 60, sup.read_text()[-3000:]
        time.sleep(0.2)
    # Mid-run: a fault after the last step (the final save, the last barrier) takes the restart path.
    at = read_heartbeats(run_dir)[HUNG]
    assert at["step"] < STEPS - 20, (at, sup.read_text()[-3000:])
    os.kill(beats[HUNG]["pid"], signal.SIGSTOP)
    rec = wait_job(job, 240)
    log = (run_dir / "slurm" / f"{job}_0_log.err").read_text()
    assert rec["state"] == "COMPLETED", (rec, log[-4000:])
    # The replacement ran on the spare: neither of the step's nodes.
    nodes = {h["node"] for h in beats.values()}
    new = read_heartbeats(run_dir)[VICTIM]  # the newest of the node files' beats
    assert new["pid"] != beats[VICTIM]["pid"] and new["node"] not in nodes, (new, nodes, log[-4000:])
    # ... the warm spare held there (launcher.warm_spare): loaded before the fault, its output then the rank's.
    assert f"the warm spare on {new['node']} takes rank {VICTIM}" in log, log[-4000:]
    spare = (run_dir / "slurm" / f"{job}_spare-{new['node']}_log.err").read_text()
    assert f"warm spare on {new['node']} (pid {new['pid']}): loaded in" in spare, spare
    # The hung rank: named by the store host, killed, replaced on its own node (the spare is taken).
    hung = read_heartbeats(run_dir)[HUNG]
    assert f"rank {HUNG} neither left the broken generation nor joined the next" in log, log[-4000:]
    assert f"killing pid {beats[HUNG]['pid']} on {beats[HUNG]['node']}" in log, log[-4000:]
    assert f"rank {HUNG} was hung: pid {beats[HUNG]['pid']} on {beats[HUNG]['node']} killed" in log, log[
        -4000:
    ]
    assert hung["pid"] != beats[HUNG]["pid"] and hung["node"] == beats[HUNG]["node"], (hung, beats[HUNG])
    # ... by the warm spare started there once rank 2's recovery trained.
    assert f"a warm spare on {hung['node']} again" in log, log[-4000:]
    assert f"the warm spare on {hung['node']} takes rank {HUNG}" in log, log[-4000:]
    assert f"(pid {hung['pid']}): loaded in" in again.read_text()
    # The survivors kept their processes; every rank rolled back to one step, each time.
    for gen, victim, pids in ((1, VICTIM, {**_pids(beats), VICTIM: new["pid"]}),
                              (2, HUNG, {**_pids(beats), VICTIM: new["pid"], HUNG: hung["pid"]})):  # fmt: skip
        lines = {r: said(run_dir, job, r, gen) for r in range(4)}
        for r in range(4):
            role = "replacement" if r == victim else "survivor"
            assert lines[r][:2] == (pids[r], role), (gen, r, lines[r], pids)
        assert len({x[2] for x in lines.values()}) == 1, lines
    # faults.jsonl: the trainer's records of the recoveries, no restart by the supervisor.
    recs = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    faults = [r for r in recs if "event" not in r]
    resumed = [r for r in recs if r.get("event") == "resumed"]
    assert len(faults) == len(resumed) == 2, recs
    for f, cause, ranks in ((faults[0], "rank_lost", [VICTIM]), (faults[1], "rank_hung", [HUNG])):
        assert (f["cause"], f["action"], f["ranks"], f["state_from"]) == (cause, "in_process", ranks,
                                                                          "peer memory"), f  # fmt: skip
        assert f["steps_redone"] <= 1, f
    assert all(r["recovery"] == "in_process" for r in resumed), recs
    f, back = faults[-1], resumed[-1]
    g = json.loads((run_dir / "goodput.json").read_text())
    assert (g["in_process_recoveries"], g["restarts"], g["failures"]) == (2, 0, 2), g
    assert json.loads((run_dir / "result.json").read_text())["status"] == "completed"
    # meshrun status says it as a local run's recovery.
    st = subprocess.run([sys.executable, "-m", "launcher.status", str(run_dir)], capture_output=True, text=True,
                        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)  # fmt: skip
    assert st.returncode == 0 and "restarts 0, in-process recoveries 2" in st.stdout, st.stdout + st.stderr
    assert (
        f"recovered in process from peer memory: {back['seconds_lost']:.1f} s to step {back['first_step']}"
        in (st.stdout)
    )
    for f in faults:
        print(
            f"in-process recovery on Slurm ({f['cause']}): {f['recovery_s']:.2f} s from its detection to step "
            f"{f['first_step']} done, {f['steps_redone']} step(s) redone, rolled back to step {f['rolled_back_to']}"
        )
    print(f"goodput recovery {g['buckets_s']['recovery']:.2f} s")


def _pids(beats: dict[int, dict]) -> dict[int, int]:
    return {r: h["pid"] for r, h in beats.items()}


# A campaign (pytest -m campaign): a partner pair lost at once on Slurm.
@pytest.mark.campaign
def test_a_partner_pair_lost_at_once_falls_back_to_the_durable_checkpoint(tmp_path: Path) -> None:
    """Ranks 0 and 2 (rank 2's copy is in rank 0's memory) SIGKILLed together
    once step 10's save is committed (saves every 10 steps): no step every needed copy holds, so
    every rank loads the durable checkpoint of step 10, in process (the
    survivors keep their processes), said in faults.jsonl and ``meshrun
    status``; the job COMPLETES with the uninterrupted run's losses."""
    run_dir, ref_dir = tmp_path / "run", tmp_path / "ref"
    every = "storage.save_every_steps=10"
    job = submit(*COMMON, every, "cluster.spare_nodes=1", f"launcher.run_dir={run_dir}", cwd=tmp_path)
    ref = start_local_run(ref_dir, *TRAINING, every, "cluster.local_processes=4", "cluster.metrics_port=0",
                          cwd=tmp_path)  # fmt: skip
    try:
        metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 200
        while '"event": "checkpoint_committed", "step": 10' not in (
            metrics.read_text() if metrics.exists() else ""
        ):
            assert time.monotonic() < deadline, "step 10's checkpoint never committed"
            time.sleep(0.2)
        beats = {r: heartbeat_at(run_dir, r, 12) for r in range(4)}
        for r in (0, 2):
            os.kill(beats[r]["pid"], signal.SIGKILL)
        rec = wait_job(job, 300)
        log = (run_dir / "slurm" / f"{job}_0_log.err").read_text()
        assert rec["state"] == "COMPLETED", (rec, log[-4000:])
        assert ref.wait(timeout=240) == 0, Path(f"{ref_dir}.out").read_text()[-3000:]
    finally:
        if ref.poll() is None:
            os.killpg(ref.pid, signal.SIGKILL)
            ref.wait()
    recs = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    faults = [r for r in recs if "event" not in r]
    assert len(faults) == 1, recs
    f = faults[0]
    assert (f["action"], sorted(f["ranks"]), f["state_from"], f["rolled_back_to"]) == (
        "in_process", [0, 2], "durable checkpoint", 10
    ), f  # fmt: skip
    for r in (1, 3):  # the survivors kept their processes
        assert said_from(run_dir, job, r, 1, "durable checkpoint")[:2] == (beats[r]["pid"], "survivor")
    st = subprocess.run([sys.executable, "-m", "launcher.status", str(run_dir)], capture_output=True, text=True,
                        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)  # fmt: skip
    assert "recovered in process from durable checkpoint" in st.stdout, st.stdout
    want, got = dict(loss_history(ref_dir)), dict(loss_history(run_dir))
    assert sorted(got) == list(range(1, STEPS + 1)) and got == want
    print(f"a partner pair lost on Slurm: {f['recovery_s']:.2f} s to step {f['first_step']}, "
          f"{f['steps_redone']} step(s) redone from the step-10 checkpoint")  # fmt: skip
