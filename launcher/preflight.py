"""``python -m launcher.preflight`` (``meshrun preflight``): check this node (or a job's nodes) before training; the batch script runs it.
The command lives in :mod:`launcher.nodecheck.nodepreflight`; this name is kept for scripts, docs and
rendered batch scripts."""

import sys

from launcher.nodecheck.nodepreflight import main

if __name__ == "__main__":
    sys.exit(main())
