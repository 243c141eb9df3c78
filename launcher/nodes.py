"""``python -m launcher.nodes`` (``meshrun nodes``): the bad-node ledger and
the DRAIN lines for its nodes. The command lives in :mod:`launcher.ops.nodes`."""

import sys

from launcher.ops.nodes import main

if __name__ == "__main__":
    sys.exit(main())
