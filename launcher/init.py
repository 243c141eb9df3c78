"""``python -m launcher.init``: the documented alias of ``meshrun init`` (launcher/commands/init.py)."""

import sys

from launcher.commands.init import main

if __name__ == "__main__":
    sys.exit(main())
