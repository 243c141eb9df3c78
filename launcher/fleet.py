"""``python -m launcher.fleet``: the documented alias of ``meshrun fleet`` (launcher/commands/fleet.py)."""

import sys

from launcher.commands.fleet import main

if __name__ == "__main__":
    sys.exit(main())
