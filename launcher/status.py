"""``python -m launcher.status``: the documented alias of ``meshrun status`` (launcher/commands/status.py)."""

import sys

from launcher.commands.status import main

if __name__ == "__main__":
    sys.exit(main())
