"""Which task srun says failed first, for the supervisor's attribution
(launcher/ops/supervise.py). Pure text work on srun's error lines."""

from __future__ import annotations

import re

SRUN_ERROR = re.compile(r"srun: error: (\S+): tasks? ([0-9,\-]+): (.+)")
# A rank's error that only says a peer went away (the cause is elsewhere).
PEER_ERROR = re.compile(r"closed by peer|Connection reset|remote worker|Broken pipe|NCCL.*remote", re.I)
SIGNAL_RACE_S = 5.0


def signalled_line(
    srun_errors: list[tuple[float, str]], errors: list[tuple[float, int, str]]
) -> tuple[float, str] | None:
    """srun's first (time, line) of a task killed by a signal (not srun's own
    SIGTERM of kill-on-bad-exit), when it is the cause: it came within
    SIGNAL_RACE_S of srun's first error line (a survivor's peer error can win
    that race), or the first Python error (time, rank, error) only says a
    peer went away. A Python error followed by kills after KillWait: None."""
    sig = [
        (t, line)
        for t, line in srun_errors
        if (m := SRUN_ERROR.search(line))
        and not m.group(3).startswith(("Exited with exit code", "Terminated"))
    ]
    if not sig:
        return None
    if not errors or PEER_ERROR.search(errors[0][2]) or sig[0][0] - srun_errors[0][0] <= SIGNAL_RACE_S:
        return sig[0]
    return None
