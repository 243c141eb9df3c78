"""``python -m launcher.taskwrap RUN_DIR``: every task of a job=script run
(launcher/slurm/render.py, launcher/run/local.py): the team's program under meshrun."""

import sys

# First, before anything slow (meshrun's imports, the spec, the workdir
# copy): a stop signal from here on is the task's stop, never its death.
from launcher.taskwrap.stopsig import StopRequest, ignore_stops

STOP = StopRequest()
STOP.install()

from launcher.taskwrap.wrapper import main  # noqa: E402 - after the handlers, on purpose

if __name__ == "__main__":
    rc = main(stop=STOP)
    ignore_stops()  # no late stop signal kills the interpreter as it exits
    sys.exit(rc)
