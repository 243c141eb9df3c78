"""``python -m launcher.diff``: the documented alias of ``meshrun diff`` (launcher/commands/diff.py)."""

import sys

from launcher.commands.diff import main

if __name__ == "__main__":
    sys.exit(main())
