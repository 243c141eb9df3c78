"""``python -m train <run_dir>``: what every rank of a run executes."""

import sys

from train.entry import main

if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m train <run_dir>", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
