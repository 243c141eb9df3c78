"""``python -m launcher.image``: the documented alias of ``meshrun image`` (launcher/commands/image.py)."""

import sys

from launcher.commands.image import main

if __name__ == "__main__":
    sys.exit(main())
