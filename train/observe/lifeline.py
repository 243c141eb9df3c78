"""A local rank never outlives its launcher.

``launcher/run/local.py`` starts every rank in its own session (Ctrl-C reaches
the launcher only), so nothing would stop the ranks when the launcher itself
dies (a SIGKILL, the OOM killer, a closed terminal): they would keep training
against the run directory and its checkpoint tiers beside the user's next
start. The launcher exports its pid as :data:`LAUNCHER_PID_ENV`; each rank
calls :func:`tie_to_launcher` first thing, which

- asks Linux for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``),
  then checks the parent is still the launcher (it may have died before the
  prctl took effect);
- starts a watchdog thread that exits the process once the launcher pid is
  gone (platforms without prctl, and a second line of defence).

Slurm tasks do not set the variable: slurmstepd owns their lifetime.
Standard library only: runs before torch is imported.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading

from launcher.config.spec import LAUNCHER_PID_ENV

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 1.0


def _orphaned(launcher_pid: int) -> bool:
    return os.getppid() != launcher_pid


def _set_pdeathsig() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(launcher_pid: int) -> None:
    stop = threading.Event()
    while not stop.wait(WATCH_INTERVAL_S):
        if _orphaned(launcher_pid):
            print(f"meshrun train: launcher (pid {launcher_pid}) is gone; exiting", file=sys.stderr)
            os._exit(1)  # no clean-up: peers may be inside collectives


def tie_to_launcher() -> None:
    """No-op unless started by the local launcher."""
    value = os.environ.get(LAUNCHER_PID_ENV, "")
    if not value.isdigit():
        return
    launcher_pid = int(value)
    _set_pdeathsig()
    if _orphaned(launcher_pid):
        os._exit(1)  # the launcher died before the death signal was armed
    threading.Thread(target=_watch, args=(launcher_pid,), name="meshrun-lifeline", daemon=True).start()
