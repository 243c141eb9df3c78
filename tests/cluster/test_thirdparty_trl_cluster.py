"""A training program no one here wrote, from the package index, unchanged,
on the real test cluster (scripts/testcluster.sh) through ``python -m
launcher job=script``: TRL's supervised fine-tuning script
(``python -m trl.scripts.sft``, what ``trl sft`` runs: the Hugging Face
Trainer) with TRL, transformers, datasets, accelerate and torch from the
package index in its own virtualenv, 2 nodes x 2 tasks and a spare, gloo
on CPU (``--use_cpu``), on a tiny random Llama and a local text dataset
(tests/programs/hf_tiny.py).

The Trainer saves ``out/checkpoint-N`` every ``--save_steps`` and resumes
only when told where (``--resume_from_checkpoint``): ``job.resume_from``
finds the newest complete one (its ``trainer_state.json``, written last)
at each start and ``job.resume_args`` names it. It prints its progress as a
tqdm bar on rank 0 only, and it saves nothing on SIGTERM (it dies of it).

One job meets every fault in turn: one program SIGKILLed (restarted on the
spare, resumed from its newest checkpoint), the job preempted by a
training-QOS job (SIGTERM, the site default: requeued, resumed from its
newest checkpoint in the next allocation), one program SIGSTOPped (the hang
found from rank 0's bar going quiet, restarted on the spare), and it
completes; goodput.json has its buckets and the fleet lists it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import heartbeat_at
from thirdparty_util import (
    VenvsAhead,
    goodput_and_fleet,
    kill_and_hang_faults,
    preempt_hang_and_finish,
    program_of,
    rank_beat,
    started_since,
    step_drops,
)

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]
TINY = Path(__file__).resolve().parents[1] / "programs" / "hf_tiny.py"
STEPS = 160
SAVE_EVERY = 20
PINS = ["torch==2.13.0", "transformers==5.25.0", "trl==1.16.0", "datasets==5.2.0", "accelerate==1.16.0"]
# Built beside an earlier test that mostly waits (tests/conftest.py: venvs_start).
VENV = ("trl", PINS)


@pytest.fixture(scope="module")
def venv(venvs_ahead: VenvsAhead) -> Path:
    """Its own virtualenv: TRL and its stack from the package index."""
    return venvs_ahead.python(*VENV)


def test_trl_sft_in_its_own_venv_survives_sigkill_preemption_and_a_hang(venv: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    proj, run_dir = tmp_path / "proj", tmp_path / "run"
    subprocess.run([str(venv), str(TINY), str(proj)], check=True, timeout=300)
    args = [
        "--model_name_or_path", "model", "--dataset_name", "data", "--output_dir", "out",
        "--max_steps", str(STEPS), "--save_steps", str(SAVE_EVERY), "--logging_steps", "1",
        "--per_device_train_batch_size", "4", "--max_length", "64", "--learning_rate", "1e-3",
        "--use_cpu", "true", "--report_to", "none", "--dataloader_num_workers", "0",
    ]  # fmt: skip
    env = {"ACCELERATE_USE_CPU": "true", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run(
        [sys.executable, "-m", "launcher", "job=script", "job.module=trl.scripts.sft", f"job.workdir={proj}",
         f"job.python={venv}", f"job.args=[{','.join(args)}]",
         "job.resume_from=out/checkpoint-*/trainer_state.json",
         'job.resume_args=[--resume_from_checkpoint,"{dir}"]',
         *[f"+cluster.env.{k}={v}" for k, v in env.items()],
         "cluster=testcluster", "cluster.nodes=2", "cluster.gpus_per_node=2", "cluster.spare_nodes=1",
         "launcher.exclusive=false", "qos.time_limit_min=10", "launcher.signal_lead_s=30",
         "launcher.hang_startup_timeout_s=150", "launcher.hang_timeout_s=10",
         f"launcher.runs_root={tmp_path}", f"launcher.run_dir={run_dir}"],
        capture_output=True, text=True, timeout=120, cwd=proj,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    job = json.loads((run_dir / "slurm" / "job.json").read_text())["job_id"]
    work = run_dir / "workdir"

    # The Trainer prints its bar on rank 0 only: rank 0's heartbeat is the
    # progress; the other ranks follow it (launcher/selfheal/hangwatch.py).
    # 1. SIGKILL rank 3's program once a checkpoint is complete: the restart
    # on the spare is told to resume from it.
    h = heartbeat_at(run_dir, 0, SAVE_EVERY + 5, timeout=300)
    assert (work / "out" / f"checkpoint-{SAVE_EVERY}" / "trainer_state.json").exists()
    victim = rank_beat(run_dir, 3, h["attempt"])
    os.kill(program_of(victim["pid"]), signal.SIGKILL)
    killed_at = time.time()
    h1 = started_since(run_dir, 0, killed_at, SAVE_EVERY + 3, 240)
    # 2. Preempted by a training-QOS job on rank 0's node once a newer
    # checkpoint is complete: Slurm sends SIGTERM, the Trainer dies of it,
    # the job requeues; the next allocation resumes from the newest checkpoint.
    heartbeat_at(run_dir, 0, 2 * SAVE_EVERY + 3, timeout=240)
    # 3. Hung: rank 3's program stopped (after the preemption's resume).
    preempted_at, h2, stopped = preempt_hang_and_finish(run_dir, job, h1["node"], STEPS, 420)

    kill, hang, resumed = kill_and_hang_faults(run_dir, job, victim, stopped)
    # Each start after the first was told where to resume (program_start's
    # resume_from), each from a newer checkpoint, and the Trainer did.
    starts = [
        json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"program_start"' in x
    ]
    told = [s.get("resume_from", "") for s in starts]
    assert told[0] == "" and all(told[1:]) and len(told) >= 4, told  # first, kill, preemption, hang
    ckpts = [int(Path(t).parent.name.split("-")[1]) for t in told[1:]]
    assert ckpts == sorted(ckpts) and ckpts[0] >= SAVE_EVERY, told
    # The Trainer did resume: each new process's first step follows a checkpoint.
    assert all(f.get("first_step", 0) > SAVE_EVERY for f in resumed) and h2["first_step"] > 2 * SAVE_EVERY, (
        resumed
    )
    # The program's checkpoints, in the run's own copy of its project.
    assert (work / "out" / f"checkpoint-{STEPS}" / "trainer_state.json").exists()
    assert not list((tmp_path / ".code").glob("*/project/out"))

    good = goodput_and_fleet(run_dir, tmp_path, job)
    assert good["allocations"] >= 2 and good["requeues"]["preemptions"] >= 1, good
    assert good["restarts"] == good["allocations"] - 1 + 2, good  # the requeue(s), the kill, the hang
    drops = step_drops(run_dir)
    print(
        f"\ntrl sft (HF Trainer, own venv), 2x2 + spare: SIGKILL at step {h['step']}: "
        f"{h1['first_step_at'] - killed_at:.0f} s to the first step again, from step {h1['first_step']}; "
        f"preempted: {h2['first_step_at'] - preempted_at:.0f} s from the preemptor's submission to the first "
        f"resumed step, from step {h2['first_step']}; hang: detected {resumed[-1].get('detect_s')} s after the "
        f"last redraw, {resumed[-1].get('seconds_lost')} s to the first resumed step, "
        f"{resumed[-1].get('steps_redone')} steps redone; resumed from {ckpts}; step drops {drops}; "
        f"goodput {good['ettr']:.3f}; {good['allocations']} allocations; "
        f"{(run_dir / 'faults.jsonl').read_text().count('end: completed')} teardown hang(s) ended; "
        f"{time.monotonic() - t0:.0f} s wall"
    )
