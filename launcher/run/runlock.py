"""One owner per run directory: a local run holds an exclusive ``flock`` on
``<run_dir>/launcher.lock`` for its whole life, so a second start of the same
run dir while the first runs is refused instead of training beside it.

The kernel drops a flock when its holder dies, however it dies (SIGKILL, OOM
kill), so a crash cannot leave a stale lock; the pid/host/time written into
the file are only for the message. Ranks do not inherit the descriptor
(``subprocess`` closes it); they die with the launcher (train/lifeline.py).

Slurm jobs do not take it: the submitting command returns at once, and a
batch job's flock on a shared filesystem is only as good as that mount's lock
support (Lustre ``localflock`` or NFS without lockd would make it a no-op or
an error); a requeued job must also be free to start again. There the owner
is the run's job as Slurm reports it (:func:`check_slurm_owner`): a new
submission of a run dir whose job is still queued or running is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from launcher.config.validate import ConfigError

LOCK_FILE = "launcher.lock"
# squeue states of a job that still owns its run dir (a requeued job is
# PENDING or REQUEUED until it runs again).
ACTIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESIZING",
    "STOPPED",
    "SIGNALING",
    "STAGE_OUT",
}


@contextlib.contextmanager
def own_run_dir(run_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the run directory's lock for the ``with`` block; ConfigError
    (naming the current owner) when another live process holds it."""
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = path.read_text().strip() or "another process"
            raise ConfigError(
                f"launcher.run_dir={str(run_dir)!r} is in use: {owner} is running it. A run dir has one "
                "owner at a time; wait for that run to end (or stop it with Ctrl-C), or start a new run "
                "in another run dir"
            ) from None
        os.ftruncate(fd, 0)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.write(fd, f"launcher pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def check_slurm_owner(run_dir: str | os.PathLike[str]) -> None:
    """Refuse to submit a run dir whose Slurm job (``slurm/job.json``) is
    still queued or running: two jobs would train the same run at once.
    Asks the controller (squeue), not the accounting database, which may
    not have heard of a job submitted a moment ago."""
    from launcher.slurm import cluster as slurm
    from launcher.slurm.submit import read_job_id

    job_id = read_job_id(run_dir)
    if not job_id:
        return
    # An ended job is gone from squeue (or refused as an invalid id): no owner.
    out = slurm.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
    states = set(out.stdout.split()) & ACTIVE_STATES if out.returncode == 0 else set()
    if states:
        raise ConfigError(
            f"launcher.run_dir={str(run_dir)!r} is in use: Slurm job {job_id} ({', '.join(sorted(states))}) "
            "owns it. A run dir has one owner at a time; wait for that job to end, or cancel it with "
            f"python -m launcher.status cancel {run_dir}"
        )
