"""Preflight: check a node against its cluster preset before training burns
GPU-hours, and stop the job naming the node when something is wrong.

``python -m launcher.preflight`` (``meshrun preflight``): this machine
against a composed config; ``--node RUN_DIR`` (a job's first step, once per
node), ``--record RUN_DIR`` (the batch host, after a failed ``--node`` step),
``--report RUN_DIR`` (every node's table). The checks and what each mode
does: launcher/nodecheck/nodepreflight.py.
"""

from __future__ import annotations

import argparse
import sys

from launcher.config.prog import describe, prog
from launcher.nodecheck.nodepreflight import run_here, run_node, run_record, run_report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("python -m launcher.preflight"), description=describe(__doc__))
    ap.add_argument("--node", metavar="RUN_DIR", help="check this node for a planned run (job step)")
    ap.add_argument("--report", metavar="RUN_DIR", help="print every node's results of a run")
    ap.add_argument(
        "--record", metavar="RUN_DIR", help="record the nodes a job's --node step failed (batch host)"
    )
    ap.add_argument("--no-comm", action="store_true", help="skip the all-reduce test (this-machine mode)")
    ap.add_argument("--out", metavar="DIR", help=argparse.SUPPRESS)  # --node's results elsewhere (burn-ins)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. cluster=4node")
    args = ap.parse_args(argv)
    if args.node:
        return run_node(args.node, args.out)
    if args.report:
        return run_report(args.report)
    if args.record:
        return run_record(args.record)
    from launcher.config.validate import ConfigError

    try:
        return run_here(args.overrides, comm=not args.no_comm)
    except ConfigError as e:
        print(f"meshrun: error: {e}", file=sys.stderr)
        return 2
