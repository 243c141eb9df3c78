"""``python -m train <run_dir>``: what every rank of a run executes."""

import sys

from train.observe.lifeline import tie_to_launcher

# First, before torch loads: a local rank must not outlive its launcher.
tie_to_launcher()

from train.jobs.entry import main  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m train <run_dir>", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
