"""``python -m launcher.nccl``: the documented alias of ``meshrun nccl`` (launcher/commands/nccl.py)."""

import sys

from launcher.commands.nccl import main

if __name__ == "__main__":
    sys.exit(main())
