"""``python -m launcher.taskwrap RUN_DIR``: every task of a job=script run
(launcher/slurm/render.py, launcher/run/local.py): the team's program under meshrun."""

import sys

from launcher.taskwrap.wrapper import main

if __name__ == "__main__":
    sys.exit(main())
