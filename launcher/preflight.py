"""``python -m launcher.preflight``: the documented alias of ``meshrun preflight`` (launcher/commands/preflight.py)."""

import sys

from launcher.commands.preflight import main

if __name__ == "__main__":
    sys.exit(main())
