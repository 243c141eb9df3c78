"""``python -m launcher.predict``: the documented alias of ``meshrun predict`` (launcher/commands/predict.py)."""

import sys

from launcher.commands.predict import main

if __name__ == "__main__":
    sys.exit(main())
