"""``python -m launcher [group=option ...] [key=value ...]``: ``meshrun run``
(launcher/commands/run.py)."""

import sys

from launcher.commands.run import main

if __name__ == "__main__":
    sys.exit(main())
