"""Stop signals (preemption, time limit, cancel): the handler only sets a flag.

Slurm sends USR2 ``launcher.signal_lead_s`` seconds before the time limit
(``--signal=USR2@<lead>``; USR1 belongs to NCCL), and at preemption either
USR2 (``PreemptParameters=send_user_signal``) or, by default, SIGTERM, which
is also what ``scancel`` sends. Both mean "keep the work": doing real work
inside a signal handler (collectives, checkpoint I/O) breaks runs, so the
handler records the signal and when it came, and the training loop, at its
next step boundary, saves a checkpoint, waits for it (and for uploads) no
longer than the time left before Slurm's kill (:func:`stop_budget_s`), writes
``result.json`` with status ``preempted`` and exits with
:data:`REQUEUE_EXIT_CODE`. Whether the job is then requeued (preempted, time
limit) or ends (cancelled) is decided by the batch script from Slurm's own
view of the job (launcher/slurm/render.py), outside any container: a task cannot
tell a preemption's SIGTERM from a cancel's.

``python -m train`` (train/__main__.py) installs the handler first thing,
before torch is imported: a USR2 that arrives while torch is still loading
(short limits, a busy node) is then recorded instead of killing the task.
This module itself imports nothing heavy at its top for that reason.

All ranks must agree to stop at the same step: a rank whose flag is set while
another's is not would deadlock the next collective. :meth:`PreemptFlag.agreed`
takes the max over ranks when a process group is up.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType

from launcher.config.plandata import stop_margin_s

# The exit codes (REQUEUE_EXIT_CODE: checkpointed, requeue; UNCOMMITTED_EXIT_CODE:
# stopped, but the final checkpoint did not commit) are the run dir's contract:
# launcher/config/runfiles.py.
# SIGTERM too: preemption without send_user_signal sends it, and a cancelled
# job's work is worth keeping as well (the batch script does not requeue it).
SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
# Slurm's default KillWait: SIGTERM (scancel, end of the grace time) to SIGKILL.
DEFAULT_KILL_WAIT_S = 30.0


class PreemptFlag:
    """Set by USR2 or SIGTERM; polled by the training loop."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum: int | None = None
        self.at: float | None = None  # time.monotonic() of the first signal

    def set(self, signum: int = signal.SIGUSR2) -> None:
        if self.signum is None:
            self.signum = signum
            self.at = time.monotonic()
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def agreed(self) -> bool:
        """True on every rank once any rank has been signalled (a collective:
        call it on all ranks at the same step, or not at all)."""
        return self.agreed_with(False)[0]

    def agreed_with(self, other: bool) -> tuple[bool, bool]:
        """(signalled, ``other``), each True on every rank once it is on any
        rank, read at once (a blocking collective: the end of a run)."""
        signalled, *rest = self.vote((other,)).result()
        return signalled, rest[0]

    def vote(self, others: tuple[bool, ...], pg: object = None) -> StopVote:
        """Start the loop's one small all-reduce of a step: this rank's
        signal and ``others`` (saves keep failing, a time-based save is
        due), max over ranks, non-blocking. :meth:`StopVote.result` reads it,
        normally a step later, when it has long finished, so the host never
        waits on it while the device works: a stop then comes at most one
        step later than a blocking read would see it (the stop lead counts
        that step: launcher/plan/stopping.py). ``pg``: a CPU (gloo) group
        for the vote, so that reading it waits for no device work."""
        return StopVote(self, (self.is_set(), *others), pg)

    @property
    def reason(self) -> str:
        if self.signum is None:
            return ""
        return signal.Signals(self.signum).name


class StopVote:
    """One agreement in flight: started by :meth:`PreemptFlag.vote`."""

    def __init__(self, flag: PreemptFlag, local: tuple[bool, ...], pg: object = None) -> None:
        import torch
        import torch.distributed as dist

        self.flag, self.local, self.work = flag, local, None
        self.tensor = torch.tensor([int(x) for x in local], dtype=torch.int32)
        if not (dist.is_available() and dist.is_initialized()):
            return
        if pg is None and dist.get_backend() == "nccl":
            self.tensor = self.tensor.cuda()
        self.work = dist.all_reduce(self.tensor, op=dist.ReduceOp.MAX, group=pg, async_op=True)

    def result(self) -> tuple[bool, ...]:
        """The agreed flags (True everywhere when True on any rank); waits
        for the all-reduce when it has not finished yet (counted as a host
        sync, train/observe/hostsync.py, when the vote ran on the device)."""
        if self.work is None:
            return self.local
        from train.observe import hostsync

        if self.tensor.is_cuda and not self.work.is_completed():
            hostsync.note("the stop vote's all-reduce was not finished when read")
        # On a CPU group an unfinished vote waits for a slower peer's host
        # thread, not for the device: not a host sync (a loaded host's gloo
        # ranks hit it at random).
        self.work.wait()
        if self.tensor.is_cuda:
            hostsync.note("the stop vote read from the device (no CPU group)")
        with hostsync.unwatched():  # a CPU tensor, or counted just above
            values = tuple(bool(x) for x in self.tensor.tolist())
        if values[0] and not self.flag.is_set():
            # Another rank was signalled: start this rank's clock now, with
            # the shorter of the two windows (its signal is unknown here).
            self.flag.set(signal.SIGTERM)
        self.work = None
        return values


_flag: PreemptFlag | None = None


def _handler(signum: int, frame: FrameType | None) -> None:
    # Only set the flag: no I/O, no locks, no collectives here.
    assert _flag is not None
    _flag.set(signum)


def install(signals: tuple[signal.Signals, ...] = SIGNALS) -> PreemptFlag:
    """Install the handler (main thread only) and return the process's flag."""
    global _flag
    if _flag is None:
        _flag = PreemptFlag()
    for sig in signals:
        signal.signal(sig, _handler)
    return _flag


def restart_count() -> int:
    """How many times Slurm has requeued this job (0 on the first run):
    preemptions, time limits and failures together."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def requeue_counts() -> dict[str, int]:
    """This job's requeues by cause, as the batch script counted them
    (launcher/slurm/render.py): after a preemption, at a time limit, and reruns
    after failures (the only ones ``launcher.max_restarts`` limits)."""
    names = {
        "preemptions": "MESHRUN_PREEMPT_REQUEUES",
        "time_limits": "MESHRUN_TIME_LIMIT_REQUEUES",
        "failures": "MESHRUN_FAILURE_RESTARTS",
    }
    return {k: int(os.environ.get(v, "0") or 0) for k, v in names.items()}


def window_s(signum: int | None, signal_lead_s: float, grace_time_s: float, kill_wait_s: float) -> float:
    """Seconds from a stop signal to Slurm's kill, at the least.

    USR2 comes ``signal_lead_s`` before the time limit, or at the start of a
    preemption's grace time (send_user_signal). SIGTERM comes at the start of
    the grace time (preemption) or ``KillWait`` before SIGKILL (scancel,
    kill-on-bad-exit); the task cannot tell which, so the shorter counts.
    """
    if signum == signal.SIGTERM:
        return min(grace_time_s, kill_wait_s)
    return min(signal_lead_s, grace_time_s)


def kill_wait_s() -> float:
    """Slurm's KillWait, exported by the batch script (Slurm's default else)."""
    try:
        return float(os.environ.get("MESHRUN_KILL_WAIT_S") or DEFAULT_KILL_WAIT_S)
    except ValueError:
        return DEFAULT_KILL_WAIT_S


def stop_budget_s(flag: PreemptFlag, signal_lead_s: float, grace_time_s: float) -> float | None:
    """Seconds the end of a signalled run may still wait (commit, uploads)
    so that the ranks exit and the job is requeued before Slurm kills it;
    None when no signal came (the normal, unhurried end)."""
    if flag.at is None:
        return None
    window = window_s(flag.signum, signal_lead_s, grace_time_s, kill_wait_s())
    return max(0.0, window - stop_margin_s(window) - (time.monotonic() - flag.at))


def ignore_late(signals: tuple[signal.Signals, ...] = SIGNALS) -> None:
    """Training is over: a late USR2 (time limit near) or SIGTERM (srun's
    kill-on-bad-exit after another rank exited with the requeue code) must
    not kill the task while the interpreter shuts down, when Python restores
    SIG_DFL for its own handlers but keeps SIG_IGN: the exit code is what
    the batch script decides by. SIGKILL after KillWait still ends a hang."""
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)
