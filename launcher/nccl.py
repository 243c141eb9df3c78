"""``python -m launcher.nccl`` (``meshrun nccl``): the NCCL settings a cluster exports, each with its reason.
The command lives in :mod:`launcher.config.ncclenv`; this name is kept for scripts, docs and
rendered batch scripts."""

import sys

from launcher.config.ncclenv import main

if __name__ == "__main__":
    sys.exit(main())
