"""``main(run_dir)``: load the spec, join the job, run what its kind runs, report.

Called by ``python -m train <run_dir>`` (train/__main__.py) once the stop
flag is up. pretrain and finetune run the training loop
(train/loop/trainer.py), eval and generate their own jobs (evaluate.py,
generate.py). Everything that can be checked without other ranks (the layout
against the world size) is checked before any process group starts, so a bad
layout is one clear error instead of a hang."""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

import torch

from launcher.config.health import failure_line
from launcher.config.runfiles import FAILURES_FILE, REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE
from launcher.config.spec import RunSpec, load_spec
from launcher.config.validate import ConfigError
from train.inprocess import rendezvous
from train.loop.signals import PreemptFlag, install
from train.observe import heartbeat
from train.observe.runlog import RunLog
from train.parallel.dist import DistInfo, dist_info_from_env, init_process_group, shutdown
from train.parallel.mesh import ParallelDims

# One line per failing rank and attempt: "<job> <restart> rank <r> <unix time>: <error>";
# the batch script names the first one of its attempt (launcher/slurm/render.py).


def main(run_dir: str) -> int:
    try:
        spec = load_spec(run_dir)  # SpecError (a ConfigError): one line, not a traceback
        info = dist_info_from_env(spec.plan.device)
        dims = ParallelDims.from_plan(spec.plan, info.world_size)
        dims.validate(spec.cfg.model, spec.plan.stages_per_rank, compile=spec.plan.compile)
    except (ConfigError, ValueError) as e:
        print(f"meshrun train: error: {e}", file=sys.stderr)
        return 2
    # The process's flag: ``python -m train`` installed it before torch
    # loaded (a USR2 during start-up must set it, not kill the process);
    # installing again is harmless and covers a direct call of main().
    flag = install()
    torch.manual_seed(spec.cfg.train.seed)
    kind = spec.cfg.job.kind
    # Generate replicas never talk to each other (each takes its own prompts),
    # so without tensor parallel none joins a group and none waits at a
    # teardown barrier for a slower or preempted peer.
    if rendezvous.enabled():  # launcher.in_process_recovery: generations on the launcher's store
        rendezvous.start(info, spec.cfg.launcher.in_process_collective_timeout_s)
    elif kind != "generate" or spec.plan.tp > 1:
        init_process_group(info)
    log = RunLog(spec, info.is_main)
    if info.is_main:
        _record_start(spec, info.world_size)
    if spec.plan_file:  # the supervisor restarted the run on fewer nodes
        log.print(
            f"running at a shrunk data-parallel degree {spec.plan.dp} on {spec.plan.nodes} node(s), "
            f"{spec.plan.grad_accum_steps} gradient accumulation step(s): {spec.plan_why} "
            f"(plan {spec.plan_file}; spec.json keeps the planned layout)"
        )
        log.event("shrunk_layout", dp=spec.plan.dp, nodes=spec.plan.nodes, plan_file=spec.plan_file)
    try:
        code = run_kind(spec, info, dims, log, flag)
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        log.result(-1, None, "failed", error=error, rank=info.rank)
        traceback.print_exc()
        _record_failure(spec.run_dir, info.rank, error)
        heartbeat.flush_node()
        fail_fast()
    if rendezvous.active() is not None:
        rendezvous.finish()
    shutdown()
    if code in (REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE):
        # Stopped by a signal, checkpoint committed, waits bounded: exit now.
        # Upload threads still retrying (S3 down) would otherwise hold the
        # interpreter at exit past Slurm's kill; the next start resumes them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def run_kind(spec: RunSpec, info: DistInfo, dims: ParallelDims, log: RunLog, flag: PreemptFlag) -> int:
    """What the job's kind runs; its exit code."""
    kind = spec.cfg.job.kind
    if kind == "eval":
        from train.jobs.evaluate import run_eval

        return run_eval(spec, info, dims, log)
    if kind == "generate":
        from train.jobs.generate import run_generate

        return run_generate(spec, info, log, flag)
    rdzv = rendezvous.active()
    if rdzv is not None:  # launcher.in_process_recovery: the loop that survives a lost rank
        from train.loop.resilient import train_resilient

        return train_resilient(spec, info, dims, log, flag, rdzv)
    from train.loop.trainer import train  # pretrain, finetune: the training loop

    return train(spec, info, dims, log, flag)


def _record_start(spec: RunSpec, world_size: int) -> None:
    """This start in the run record (launcher/config/runrecord.py): what the job runs on."""
    from launcher.config.runrecord import record_start

    try:
        record_start(spec.run_dir, world_size)
    except OSError as e:  # said, not fatal: the run itself is unaffected
        print(f"meshrun train: could not add this start to the run record: {e}", file=sys.stderr)


def fail_fast() -> NoReturn:
    """Exit at once after a failure: no barrier or process-group teardown
    (the peers are inside other collectives, so both would wait forever) and
    no joining of checkpoint/upload threads. The launcher (local) or srun
    (Slurm) sees the exit and stops the other ranks."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _record_failure(run_dir: str, rank: int, error: str) -> None:
    """Say which rank failed where the batch script (and a user) looks first:
    on Slurm, kill-on-bad-exit then stops the other ranks, whose own errors
    (a peer closed the connection) come after this line."""
    job = os.environ.get("SLURM_JOB_ID", "local")
    restart = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
    first_line = failure_line(error)
    line = f"{job} {restart} rank {rank} {time.time():.3f}: {first_line}\n"
    print(f"meshrun train: rank {rank} failed: {first_line}", file=sys.stderr, flush=True)
    try:
        with open(Path(run_dir) / FAILURES_FILE, "a") as f:
            f.write(line)
    except OSError as e:  # the run dir itself may be what failed
        print(f"meshrun train: could not record the failure in {run_dir}: {e}", file=sys.stderr)
