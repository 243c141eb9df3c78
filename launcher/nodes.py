"""``python -m launcher.nodes`` (``meshrun nodes``): the bad-node ledger and
the DRAIN lines for its nodes. The command lives in :mod:`launcher.nodecheck.ledgerview`."""

import sys

from launcher.nodecheck.ledgerview import main

if __name__ == "__main__":
    sys.exit(main())
