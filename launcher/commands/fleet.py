"""``python -m launcher.fleet [RUNS_ROOT]`` (``meshrun fleet``): every run and
sweep under a runs root: progress, goodput (ETTR), cost, restarts, faults,
totals per user / QOS / partition against the QOS preset's share, pending
jobs with Slurm's reason and expected start.

    meshrun fleet runs/                   # the table (writes each run's goodput.json)
    meshrun fleet runs/ --watch 30        # refresh every 30 s (never faster than 10 s)
    meshrun fleet runs/ --json            # for scripts
    meshrun fleet runs/ --all-users       # also every other meshrun job Slurm knows (any user)
    meshrun fleet runs/ --budget-usd 5000 # spent, left and projected against a budget
                                          # (without it: the newest run's launcher.budget_usd)
    meshrun fleet runs/ --prom FILE       # goodput series for node_exporter's textfile collector
    meshrun fleet runs/ --serve [--port 8265]  # read-only web page on 127.0.0.1
    meshrun fleet alice@login:/shared/alice/runs [--serve]  # a runs root on a cluster, over SSH
                                          # (--python: the login node's Python with meshrun's packages)

The view lives in :mod:`launcher.views.fleetrows`, the page in :mod:`launcher.views.fleetweb`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from launcher.config.prog import describe, prog
from launcher.views.fleetrows import MIN_REFRESH_S, FleetView, Scheduler, collect
from launcher.views.fleettext import format_view, prom_text

DEFAULT_PORT = 8265


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog("python -m launcher.fleet"), description=describe(__doc__))
    ap.add_argument("root", nargs="?", default="runs", metavar="RUNS_ROOT", help="runs root (default: runs)")
    ap.add_argument(
        "--watch", type=float, nargs="?", const=30.0, metavar="SECONDS", help="refresh every SECONDS"
    )
    ap.add_argument("--json", action="store_true", help="print the view as JSON")
    ap.add_argument(
        "--all-users",
        action="store_true",
        help="also every other meshrun job Slurm knows, of any user (one sacct -a + one squeue -a)",
    )
    ap.add_argument(
        "--budget-usd", type=float, metavar="USD", help="show spent / left / projected against it"
    )
    ap.add_argument("--prom", metavar="FILE", help="also write every run's goodput series to FILE")
    ap.add_argument(
        "--no-write",
        action="store_true",
        help="do not write goodput.json into the run dirs (--serve never writes)",
    )
    ap.add_argument("--serve", action="store_true", help="serve a read-only web page instead")
    ap.add_argument(
        "--host",
        default="127.0.0.1",
        help="--serve: address to bind (default 127.0.0.1); only requests naming it (Host header) are answered",
    )
    ap.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"--serve: port (default {DEFAULT_PORT}; 0: any)"
    )
    ap.add_argument(
        "--python",
        metavar="PY",
        help="LOGIN:/RUNS_ROOT: the login node's Python with meshrun's packages (default: python: of "
        "your cluster preset with that login, else python3)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = _parser()
    args = ap.parse_args(argv)
    if ":" in args.root:
        over_ssh = _over_ssh(args, ap)
        if over_ssh is not None:
            return over_ssh
    if args.python:
        ap.error(
            f"--python={args.python!r} is invalid here: it names the login node's Python for LOGIN:/RUNS_ROOT"
        )
    root = Path(args.root)
    if not root.is_dir():
        ap.error(
            f"RUNS_ROOT={args.root!r} is invalid: not a directory; give the folder holding run or sweep dirs"
        )
    if args.watch is not None and args.watch < MIN_REFRESH_S:
        ap.error(
            f"--watch={args.watch:g} is invalid: refresh at most every {MIN_REFRESH_S:g} s (Slurm is shared)"
        )
    if args.budget_usd is not None and args.budget_usd < 0:
        ap.error(f"--budget-usd={args.budget_usd:g} is invalid: give an amount >= 0")
    if not 0 <= args.port <= 65535:
        ap.error(f"--port={args.port} is invalid: give 0..65535")
    scheduler = Scheduler(args.watch or MIN_REFRESH_S)
    gather = collect
    if args.all_users:
        from launcher.views.fleetall import AllUsersScheduler, collect_all

        if args.serve:
            ap.error("--all-users is invalid with --serve: the web page shows the runs root only")
        scheduler, gather = AllUsersScheduler(args.watch or MIN_REFRESH_S), collect_all  # type: ignore[assignment]
    if args.serve:
        from launcher.views.fleetweb import serve

        return serve(root, args.host, args.port, scheduler, budget_usd=args.budget_usd)  # writes nothing
    try:
        while True:
            view = gather(root, scheduler, budget_usd=args.budget_usd, write=not args.no_write)  # type: ignore[arg-type]
            if args.prom:
                Path(args.prom).write_text(prom_text(view))
            _show(view, args)
            if not args.watch:
                return 3 if view.scheduler_error else 0
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `meshrun fleet | head`: the reader left
        sys.stderr.close()
        return 0


def _over_ssh(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int | None:
    """LOGIN:/RUNS_ROOT: the login node's fleet, shown or served here
    (launcher/views/remotefleet.py); None when RUNS_ROOT is a path here."""
    from launcher.config.validate import ConfigError
    from launcher.slurm.remote import RemoteError
    from launcher.views.remotefleet import remote_fleet

    try:
        fleet = remote_fleet(args.root, args.python)
    except ConfigError as e:
        ap.error(str(e))
    if fleet is None:
        return None
    if args.prom:
        ap.error(
            "--prom writes node_exporter's file on the machine that runs it: over SSH, run it on the login node"
        )
    if args.watch is not None and args.watch < MIN_REFRESH_S:
        ap.error(
            f"--watch={args.watch:g} is invalid: refresh at most every {MIN_REFRESH_S:g} s (Slurm is shared)"
        )
    if args.all_users and args.serve:
        ap.error("--all-users is invalid with --serve: the web page shows the runs root only")
    try:
        fleet.connect()
        if args.serve:
            from launcher.views.fleetweb import serve

            def source() -> FleetView:
                return fleet.view(budget_usd=args.budget_usd)

            return serve(Path(fleet.root), args.host, args.port, Scheduler(), source=source,
                         records=fleet.records, ttl=MIN_REFRESH_S, label=str(fleet))  # fmt: skip
        while True:
            view = fleet.view(budget_usd=args.budget_usd, all_users=args.all_users, write=not args.no_write)
            _show(view, args)
            if not args.watch:
                return 3 if view.scheduler_error else 0
            time.sleep(args.watch)
    except RemoteError as e:
        print(f"meshrun: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130


def _show(view: FleetView, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(view.to_json(), indent=1))
    else:
        if args.watch and sys.stdout.isatty():
            sys.stdout.write("\033[2J\033[H")
        print(format_view(view), flush=True)
    if view.scheduler_error:
        print(f"meshrun: Slurm not read: {view.scheduler_error}", file=sys.stderr)
