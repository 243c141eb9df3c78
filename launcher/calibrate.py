"""``python -m launcher.calibrate``: the calibration fit (launcher/commands/calibrate.py)."""

import sys

from launcher.commands.calibrate import main

if __name__ == "__main__":
    sys.exit(main())
