"""``python -m launcher.rerun``: the documented alias of ``meshrun rerun`` (launcher/commands/rerun.py)."""

import sys

from launcher.commands.rerun import main

if __name__ == "__main__":
    sys.exit(main())
