"""``python -m launcher.cli COMMAND [ARGS...]``: the ``meshrun`` console script
(launcher/cli/__init__.py), by module."""

import sys

from launcher.cli import main

if __name__ == "__main__":
    sys.exit(main())
