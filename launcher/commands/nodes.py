"""``meshrun nodes``: the nodes the bad-node ledger (launcher/config/nodeledger.py)
excludes from new submissions, each with the admin's DRAIN line.

    meshrun nodes [RUNS_ROOT] [--min-faults K] [--window-h H] [--all]
    meshrun nodes --drain        # admin: run the scontrol DRAIN lines

A node the supervisor burned in (launcher/selfheal/growback.py) shows its
standing: on probation (burn-ins passed since its newest fault, not yet
enough) or cleared (its faults before the clearing burn-in no longer count).
A straggler's line (launcher/selfheal/straggler.py) shows its score: its solo
probe time over its peers' median. Lists the nodes that new submissions exclude (at least K faults within the
last H hours; defaults: launcher.bad_node_faults / bad_node_window_h), each
with its faults and the ``scontrol update NodeName=... State=DRAIN
Reason=...`` line an admin would run. ``--drain`` runs those lines (it needs
Slurm admin rights); without it nothing is changed.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

from launcher.config import nodeledger
from launcher.config.prog import describe, prog
from launcher.config.schema import LauncherConfig
from launcher.nodecheck.ledgerview import drain_command


def main(argv: list[str] | None = None) -> int:
    d = LauncherConfig()
    ap = argparse.ArgumentParser(prog=prog("python -m launcher.nodes"), description=describe(__doc__))
    # RUNS_ROOT is positional as in `meshrun fleet`; --runs-root stays as a deprecated alias.
    ap.add_argument(
        "root",
        nargs="?",
        metavar="RUNS_ROOT",
        help=f"runs root holding {nodeledger.LEDGER_FILE} (default: {d.runs_root})",
    )
    ap.add_argument("--runs-root", dest="runs_root", help=argparse.SUPPRESS)
    ap.add_argument("--min-faults", type=int, default=d.bad_node_faults, help="faults that make a node bad")
    ap.add_argument("--window-h", type=float, default=d.bad_node_window_h, help="hours the faults count for")
    ap.add_argument("--all", action="store_true", help="also list nodes below the threshold")
    ap.add_argument("--drain", action="store_true", help="admin: run the DRAIN lines (changes the cluster)")
    args = ap.parse_args(argv)
    if args.min_faults < 1:
        ap.error(f"--min-faults={args.min_faults} is invalid: must be >= 1")
    if args.window_h <= 0:
        ap.error(f"--window-h={args.window_h:g} is invalid: must be > 0")
    if args.root and args.runs_root and Path(args.root) != Path(args.runs_root):
        ap.error(f"RUNS_ROOT={args.root!r} and --runs-root={args.runs_root!r} differ: give RUNS_ROOT only")
    path = Path(args.root or args.runs_root or d.runs_root).resolve() / nodeledger.LEDGER_FILE
    records = nodeledger.read(path)
    bad = nodeledger.bad_nodes(records, 1 if args.all else args.min_faults, args.window_h)
    print(
        f"bad-node ledger {path}: {len(records)} line(s); nodes with >= {args.min_faults} fault(s) "
        f"in the last {args.window_h:g} h are excluded from new submissions"
    )
    burnins = nodeledger.standing(records)
    for node, st in burnins.items():
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st["at"]))
        what = {
            "probation": f"on probation: {st['passes']} burn-in(s) passed in a row since its newest fault",
            "cleared": "cleared by burn-ins: its earlier faults no longer count",
            "failed": "its newest burn-in FAILED",
        }[st["state"]]
        print(f"{node}: {what} (newest burn-in {when})")
    if not bad:
        print("no node is excluded: the ledger holds no node at the threshold in the window")
        return 0
    rc = 0
    for node, recs in bad.items():
        excluded = len(recs) >= args.min_faults
        print(f"{node}: {len(recs)} fault(s){'' if excluded else ' (below the threshold)'}")
        for r in recs:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"]))
            cause, run, job = (nodeledger.plain(r.get(k, "?"), 80) for k in ("cause", "run", "job"))
            score = f" score {r['score']:g}" if isinstance(r.get("score"), (int, float)) else ""
            print(f"  {when}  {cause}{score}  run {run} job {job}: {nodeledger.plain(r.get('detail', ''))}")
        if not excluded:
            continue
        cmd = drain_command(node, recs)
        print(f"  admin: {shlex.join(cmd)}")
        if args.drain:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            if out.returncode:
                print(
                    f"meshrun: {shlex.join(cmd)} failed: {(out.stderr or out.stdout).strip()}",
                    file=sys.stderr,
                )
                rc = 1
            else:
                print(f"  drained {node}")
    return rc
