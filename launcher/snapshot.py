"""``python -m launcher.snapshot``: the documented alias of ``meshrun snapshot`` (launcher/commands/snapshot.py)."""

import sys

from launcher.commands.snapshot import main

if __name__ == "__main__":
    sys.exit(main())
