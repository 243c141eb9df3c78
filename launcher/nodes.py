"""``python -m launcher.nodes``: the documented alias of ``meshrun nodes`` (launcher/commands/nodes.py)."""

import sys

from launcher.commands.nodes import main

if __name__ == "__main__":
    sys.exit(main())
