"""``python -m launcher.status`` (``meshrun status``): state, step, loss and tokens/s of a run or a sweep; logs; cancel.
The command lives in :mod:`launcher.views.runstate`; this name is kept for scripts, docs and
rendered batch scripts."""

import sys

from launcher.views.runstate import main

if __name__ == "__main__":
    sys.exit(main())
