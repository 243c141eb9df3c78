"""``python tests/stop_race_supervisor.py RUN_DIR -- srun ...``: the batch-level
supervisor (launcher/selfheal/supervisor.py, unchanged) with a stop signal sent to
itself at a chosen moment (``$STOP_AT``), for tests/cluster/test_ops_hardening_cluster.py:

- ``attribution``: SIGUSR2 while the failed attempt 0 is being attributed;
- ``start``: SIGTERM after the check before attempt 1's start, as its srun
  is being started (the race the check alone cannot close).

A real job cannot hit either moment on purpose: they last milliseconds."""

from __future__ import annotations

import os
import signal
import sys

from launcher.selfheal import step
from launcher.selfheal import supervisor as supervise

WHEN = os.environ["STOP_AT"]
_attribute, _env = supervise.Supervisor.attribute, step.StepLauncher.env


def attribute(self, a, rc):  # type: ignore[no-untyped-def]
    fault = _attribute(self, a, rc)
    if WHEN == "attribution":
        os.kill(os.getpid(), signal.SIGUSR2)
    return fault


def env(self, nodes, n, tag):  # type: ignore[no-untyped-def]
    out = _env(self, nodes, n, tag)
    if WHEN == "start" and n == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    return out


supervise.Supervisor.attribute = attribute  # type: ignore[method-assign]
step.StepLauncher.env = env  # type: ignore[method-assign]
sys.exit(supervise.main(sys.argv[1:]))
