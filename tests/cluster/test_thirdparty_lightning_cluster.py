"""A training program no one here wrote, unchanged, on the real test cluster
(scripts/testcluster.sh) through ``python -m launcher job=script``:
Lightning's transformer example (tests/programs/thirdparty/lightning/,
byte for byte from Lightning's repository) with Lightning 2.6.6 and torch
from the package index in its own virtualenv, 2 nodes x 2 tasks and a
spare, gloo on CPU. It takes no arguments: its Trainer is set through
Lightning's ``PL_TRAINER_*`` variables (``cluster.env``). It finds its
place from Slurm's variables (Lightning's SLURMEnvironment), prints its
progress as a tqdm bar (meshrun reads each redraw), and checkpoints the
way Lightning does on Slurm: on ``SIGUSR1`` it saves ``hpc_ckpt_N.ckpt``
in its cwd and resumes from it at its next start (``job.stop_signal``).

One job meets every fault in turn: one program SIGKILLed (restarted on the
spare; it has no checkpoint yet, so it starts again from step 0), then
stopped by the time limit's signal (it saves on SIGUSR1, the job requeues,
it resumes from its own checkpoint), then preempted by a training-QOS job
(SIGTERM: requeued, it resumes from its newest checkpoint), then one
program SIGSTOPped (the hang is found from its bar's redraws alone, it
restarts on the spare from its checkpoint), and it completes.

It was opt-in while, in the full suite, the time limit's stop was misread:
Slurm's USR2 reaches the steps only, a program killed at the window's end
(76) and srun's SIGTERM of the rest made srun exit 143, a fault; the
program was then shrunk to one node, which Lightning refuses
(launcher/selfheal/supervisor.py and restart.py now say a stop, and never shrink
a script job)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import heartbeat_at, resumed_beat
from thirdparty_util import (
    goodput_and_fleet,
    kill_and_hang_faults,
    make_venv,
    preempt_hang_and_finish,
    program_of,
    rank_beat,
    started_since,
    step_drops,
)

# Campaign for now (pytest -m campaign), a known open defect: since 2026-12-06
# this scenario fails on this machine three times in three (twice in full runs,
# once alone, with the code that passed in CI at stop 57): at the time limit's
# SIGUSR1 none of the four programs stops within the 22 s window (no
# "Handling auto-requeue signal" line, every task killed, exit 76), so the
# next allocation has no hpc checkpoint to resume. The likely cause, not yet
# proven: Lightning's SIGUSR1 handler runs a collective (save_checkpoint's
# barrier) inside the signal handler; a rank that takes the signal between
# collectives enters the barrier while a peer still waits in the step's
# all-reduce, and both wait forever (rank 0 never printed its "Handling
# auto-requeue signal"). A timing race, so it passed before (CI at stop 57).
# CI keeps a foreign program's faults in TRL's scenario and Hydra's suites.
pytestmark = [pytest.mark.slurm, pytest.mark.campaign, pytest.mark.usefixtures("slurm_env")]
EXAMPLE = Path(__file__).resolve().parents[1] / "programs" / "thirdparty" / "lightning" / "transformer.py"
STEPS = 90


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Its own virtualenv: torch and Lightning from the package index
    (requests: the example's dataset class needs it even with the file there)."""
    return make_venv(tmp_path_factory, "lightning", ["torch==2.13.0", "lightning==2.6.6", "requests"])


def project(root: Path) -> Path:
    """The example beside a stand-in for WikiText-2 where it looks
    (./data/wikitext-2.txt: it downloads only when that is missing); one
    epoch is longer than the run, so the bar's count is the global step."""
    proj = root / "proj"
    (proj / "data").mkdir(parents=True)
    shutil.copy(EXAMPLE, proj / "transformer.py")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)]
    lines, n = [], 0
    while n < 700_000:
        k = rng.randint(8, 30)
        n += k + 1
        lines.append(" ".join(rng.choices(words, k=k)))
    (proj / "data" / "wikitext-2.txt").write_text("\n".join(lines) + "\n")
    return proj


def test_lightning_example_in_its_own_venv_survives_sigkill_requeue_and_a_hang(
    venv: Path, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    proj, run_dir = project(tmp_path), tmp_path / "run"
    pl = {
        "ACCELERATOR": "cpu",
        "DEVICES": "2",
        "NUM_NODES": "2",
        "MAX_STEPS": str(STEPS),
        "LIMIT_TEST_BATCHES": "2",
    }
    out = subprocess.run(
        [sys.executable, "-m", "launcher", "job=script", "job.script=transformer.py", f"job.workdir={proj}",
         f"job.python={venv}", "job.stop_signal=SIGUSR1",  # Lightning's requeue signal on Slurm
         *[f"+cluster.env.PL_TRAINER_{k}={v}" for k, v in pl.items()],
         "cluster=testcluster", "cluster.nodes=2", "cluster.gpus_per_node=2", "cluster.spare_nodes=1",
         "launcher.exclusive=false", "qos.time_limit_min=8", "launcher.signal_lead_s=30",
         "launcher.hang_startup_timeout_s=150", "launcher.hang_timeout_s=10",
         f"launcher.runs_root={tmp_path}", f"launcher.run_dir={run_dir}"],
        capture_output=True, text=True, timeout=120, cwd=proj,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    job = json.loads((run_dir / "slurm" / "job.json").read_text())["job_id"]

    # Lightning prints its bar on rank 0 only: rank 0's heartbeat is the
    # progress; the other ranks follow it (launcher/selfheal/hangwatch.py).
    # 1. SIGKILL rank 3's program: no checkpoint yet, so the restart on the spare runs from step 0.
    h = heartbeat_at(run_dir, 0, 5)
    victim = rank_beat(run_dir, 3, h["attempt"])
    os.kill(program_of(victim["pid"]), signal.SIGKILL)
    killed_at = time.time()
    h1 = started_since(run_dir, 0, killed_at, 6, 240)
    # 2. The time limit's signal, sent now as Slurm sends it to the tasks at
    # the lead (--signal=USR2@lead): the program gets SIGUSR1, Lightning saves
    # hpc_ckpt_1.ckpt and calls `scontrol requeue` (meshrun's scontrol on its
    # PATH answers that one: the supervisor requeues, once); the second
    # allocation resumes from it. (At a preemption Slurm signals every
    # process of the job's steps with SIGTERM as well, and Lightning saves
    # nothing on SIGTERM: docs/your-code.md.)
    stopped_at = time.time()
    subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
    h2 = resumed_beat(run_dir, 0, 1, 3, 300)  # the second allocation's rank 0, resumed past step 1
    # 3. Preempted by a training-QOS job on rank 0's node: Slurm sends
    # SIGTERM to every process of the steps (the wrapper passes it on as
    # SIGUSR1: Lightning saves again where it can); the job requeues and the
    # next allocation resumes from its newest hpc checkpoint.
    # 4. Hung: rank 3's program stopped (after the preemption's resume).
    preempted_at, h3, stopped = preempt_hang_and_finish(run_dir, job, h2["node"], STEPS, 360)

    kill, hang, resumed = kill_and_hang_faults(run_dir, job, victim, stopped)
    # The restart after the kill starts again from 0, or from the hpc
    # checkpoint Lightning saved as srun stopped the others (the wrapper
    # passes srun's SIGTERM on as SIGUSR1); the one after the hang from its
    # checkpoint.
    assert resumed[0]["first_step"] <= kill["step"] + 1 and resumed[1]["first_step"] > 1, resumed
    # The program's own checkpoint, in the run's own copy of its project
    # (never in the code store that runs of the same code share).
    work = run_dir / "workdir"
    assert (work / "hpc_ckpt_1.ckpt").exists() and (work / "transformer.py").exists()
    assert not list((tmp_path / ".code").glob("*/project/hpc_ckpt_*"))
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/4" in log, log[:2000]
    # The time limit's requeue, the preemption's, the hang: each restored its checkpoint.
    assert log.count("Restored all states from the checkpoint at") >= 3, log[-3000:]
    assert h3["first_step"] > 1, h3
    assert "hpc_ckpt_1.ckpt" in log

    good = goodput_and_fleet(run_dir, tmp_path, job)
    # Requeued by meshrun only (Lightning's own `scontrol requeue` answered).
    assert good["allocations"] >= 3 and good["requeues"]["time_limits"] >= 1, good
    assert good["requeues"]["preemptions"] >= 1, good
    assert good["restarts"] == good["allocations"] - 1 + 2, good  # the requeues, the kill, the hang
    drops = step_drops(run_dir)
    print(
        f"\nlightning transformer example (own venv), 2x2 + spare: SIGKILL at step {h['step']}: "
        f"{h1['first_step_at'] - killed_at:.0f} s to the first step again (from 0: no checkpoint yet); "
        f"time-limit signal: {h2['first_step_at'] - stopped_at:.0f} s from the signal to the first "
        f"resumed step in the next allocation; preempted: {h3['first_step_at'] - preempted_at:.0f} s from the "
        f"preemptor's submission to the first resumed step, from step {h3['first_step']} (it was at "
        f"{h2['step']}+); hang: detected {resumed[-1].get('detect_s')} s after the last redraw, "
        f"{resumed[-1].get('seconds_lost')} s to the first resumed step, {resumed[-1].get('steps_redone')} "
        f"steps redone; step drops {drops}; "
        f"goodput {good['ettr']:.3f}; {good['allocations']} allocations; {time.monotonic() - t0:.0f} s wall"
    )
