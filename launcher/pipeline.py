"""``python -m launcher.pipeline``: the documented alias of ``meshrun pipeline`` (launcher/commands/pipeline.py)."""

import sys

from launcher.commands.pipeline import main

if __name__ == "__main__":
    sys.exit(main())
