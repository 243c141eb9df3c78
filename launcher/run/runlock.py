"""One owner per run directory: a local run holds an exclusive ``flock`` on
``<run_dir>/launcher.lock`` for its whole life, so a second start of the same
run dir while the first runs is refused instead of training beside it.

The kernel drops a flock when its holder dies, however it dies (SIGKILL, OOM
kill), so a crash cannot leave a stale lock; the pid/host/time written into
the file are only for the message. Ranks do not inherit the descriptor
(``subprocess`` closes it); they die with the launcher (train/observe/lifeline.py).

A Slurm submission takes the same lock while it asks for the owner, writes
the run dir and runs sbatch (:func:`claim_for_submission`), so a submission
and a local run, or two submissions, of one run dir cannot both pass the
owner check. The batch job itself does not hold it: a batch job's flock on a
shared filesystem is only as good as that mount's lock support (Lustre
``localflock`` or NFS without lockd would make it a no-op or an error), and
a requeued job must be free to start again. Once submitted, the owner is the
run's job as Slurm reports it (:func:`check_slurm_owner`, asked under the
lock by every local start and submission): a run dir whose job is still
queued or running is refused, and when Slurm cannot be asked the start is
refused too, naming the failure, rather than guessing that the job ended.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from launcher.config.runfiles import RunFiles
from launcher.config.validate import ConfigError
from launcher.run.undo import RunDirUndo

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


def lock_owner(run_dir: str | os.PathLike[str]) -> str | None:
    """The owner line (``launcher pid N on HOST since T``) of a live local
    run of this dir, or None when nobody holds its lock. Asks the kernel (a
    flock attempt, released at once), not the pid: a pid outlives its
    process in the file and may be reused."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return path.read_text().strip() or "another process"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def owner_pid(owner: str) -> tuple[int, str] | None:
    """(pid, host) of an owner line :func:`own_run_dir` wrote, or None."""
    parts = owner.split()
    if len(parts) >= 5 and parts[:2] == ["launcher", "pid"] and parts[3] == "on" and parts[2].isdigit():
        return int(parts[2]), parts[4]
    return None


@contextlib.contextmanager
def claim_for_submission(run_dir: str | os.PathLike[str]) -> Iterator[RunDirUndo]:
    """Hold the run dir's lock (the one local runs hold) while a submission
    asks for the owner, writes the run dir and runs sbatch. Yields the undo
    of what this submission adds, the lock file and the directories made for
    it included, so a refusal leaves nothing behind: the state before the
    lock is used only when nobody wrote there between that look and the lock."""
    before = RunDirUndo(run_dir)
    with own_run_dir(run_dir):
        after = RunDirUndo(run_dir)
        lock = Path(run_dir) / LOCK_FILE
        if {p: c for p, c in after.before.items() if p != lock} == before.before:
            yield before  # only our lock file is new: undo removes it too
        else:
            yield after


def check_slurm_owner(run_dir: str | os.PathLike[str]) -> None:
    """Refuse to start or submit a run dir whose Slurm job (``slurm/job.json``)
    is still queued or running: two owners would train the same run at once.
    Asks the controller (squeue), not the accounting database, which may
    not have heard of a job submitted a moment ago. When Slurm cannot be
    asked (not installed here, not configured, no answer, any other error)
    this refuses, naming the failure: an owner that cannot be seen is not
    assumed gone."""
    from launcher.slurm import cluster as slurm
    from launcher.slurm.submit import read_job_id

    job_id = read_job_id(run_dir)
    if not job_id:
        return
    try:
        out = slurm.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
    except slurm.SlurmError as e:  # SlurmUnavailable included
        raise _unknown_owner(run_dir, job_id, str(e)) from e
    # An ended job is gone from squeue, or refused as an invalid id once the
    # controller has forgotten it: no owner. Any other failure: unknown.
    if out.returncode != 0:
        msg = slurm.one_line(out.stderr or out.stdout)
        if "Invalid job id" not in msg:
            raise _unknown_owner(
                run_dir, job_id, f"`squeue -j {job_id}` failed (exit {out.returncode}): {msg}"
            )
        return
    states = set(out.stdout.split()) & ACTIVE_STATES
    if states:
        raise ConfigError(
            f"launcher.run_dir={str(run_dir)!r} is in use: Slurm job {job_id} ({', '.join(sorted(states))}) "
            "owns it. A run dir has one owner at a time; wait for that job to end, or cancel it with "
            f"python -m launcher.status cancel {run_dir}"
        )


def _unknown_owner(run_dir: str | os.PathLike[str], job_id: str, why: str) -> ConfigError:
    return ConfigError(
        f"launcher.run_dir={str(run_dir)!r} may be in use: it was submitted to Slurm as job {job_id} and "
        f"Slurm could not be asked whether that job still runs ({why}). Refused rather than guessed: run "
        f"this where Slurm answers, or, if you know job {job_id} has ended, remove {RunFiles(run_dir).job}"
    )
