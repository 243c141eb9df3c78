"""``python -m launcher.cost``: the documented alias of ``meshrun cost`` (launcher/commands/cost.py)."""

import sys

from launcher.commands.cost import main

if __name__ == "__main__":
    sys.exit(main())
