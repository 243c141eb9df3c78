"""``python -m train <run_dir>``: what every rank of a run executes, the one
task entry (local ranks: launcher/run/local.py; Slurm tasks:
launcher/slurm/render.py).

In this order, with nothing heavier than the standard library loaded until
the job starts:

1. the stop flag (train/loop/signals.py): USR2 and SIGTERM set it from here
   on, so a USR2 that arrives while torch is still loading (short limits, a
   busy node) is recorded instead of killing the task;
2. a local rank ties itself to its launcher (train/observe/lifeline.py);
3. a warm spare (launcher/config/warmspare.py) loads torch and the trainer
   and waits for the rank it is to replace (train/jobs/warm.py);
4. heartbeats and stack dumps, under the batch-level supervisor only
   (train/observe/heartbeat.py);
5. the job (train/jobs/entry.py): load the spec, join, run what its kind
   runs (pretrain, finetune: the training loop, train/loop/trainer.py), report;
6. late stop signals ignored while the interpreter shuts down;
7. the exit: other threads joined and atexit handlers run as the interpreter
   would, then ``os._exit``, skipping only the interpreter's finalization.
"""

import atexit
import os
import sys
import threading
from typing import NoReturn

from launcher.config.warmspare import is_spare
from train.loop import signals
from train.observe import heartbeat
from train.observe.lifeline import tie_to_launcher


def main(argv: list[str]) -> int:
    """``argv``: ``[program, run_dir]``; the task's exit code."""
    signals.install()
    tie_to_launcher()
    if len(argv) != 2:
        print("usage: python -m train <run_dir>", file=sys.stderr)
        return 2
    if is_spare():  # a warm spare (launcher.warm_spare): loaded now, a rank later, or none
        from train.jobs.warm import take_rank

        if not take_rank():
            return 0
    heartbeat.start(argv[1])
    from train.jobs.entry import main as run_job  # torch loads here, under the flag

    try:
        code = run_job(argv[1])
    except SystemExit as e:  # a job that exits itself: its code, as the interpreter would
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    signals.ignore_late()
    return code


def exit_unfinalized(code: int) -> NoReturn:
    """Exit as the interpreter would (non-daemon threads joined, atexit
    handlers run, output flushed) but without its finalization: gloo's
    threads torn down there abort a task now and then even after a clean
    ``destroy_process_group`` ("terminate called without an active
    exception": 1 in 8 runs of a 2-rank tensor-parallel generate), which
    turned a completed task into a SIGABRT."""
    # The interpreter's own first step: threading's exit hooks (an unshut
    # ThreadPoolExecutor's workers wait for work until its hook wakes them:
    # joined without it, a torch.compile'd run's task hung at its exit),
    # then every non-daemon thread joined.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_unfinalized(main(sys.argv))
