"""``python -m train.observe.preflight_comm RUN_DIR [--single-node] [--out DIR]``:
the preflight all-reduce test (this package) on every task of a job."""

from __future__ import annotations

import argparse
import sys

from train.observe.preflight_comm import run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.observe.preflight_comm")
    ap.add_argument("run_dir")
    ap.add_argument("--single-node", action="store_true", help="hold it to the intra-node figure")
    ap.add_argument(
        "--out", metavar="DIR", help="write allreduce.json here (a burn-in's), not RUN_DIR/preflight"
    )
    args = ap.parse_args(argv)
    return run(args.run_dir, args.single_node, args.out)


if __name__ == "__main__":
    sys.exit(main())
