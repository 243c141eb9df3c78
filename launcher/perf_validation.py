"""``python -m launcher.perf_validation``: the performance model's checks (launcher/commands/perf_validation.py)."""

import sys

from launcher.commands.perf_validation import main

if __name__ == "__main__":
    sys.exit(main())
