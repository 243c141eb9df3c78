"""``python -m launcher.status [RUN_OR_SWEEP_DIR]`` (``meshrun status``): one
row per job; ``logs`` and ``cancel`` actions. The rows come from
launcher/views/runstate.py.

    python -m launcher.status runs/sweeps/2026-...   # a sweep (manifest.json)
    python -m launcher.status runs/tiny-testcluster/...  # one run
    python -m launcher.status DIR --watch [SECONDS]  # refresh until every job ended
    python -m launcher.status DIR --png curves.png   # loss and tokens/s per point
    python -m launcher.status logs RUN_DIR [-n 20] [--rank N|all]  # tail a rank's output
    python -m launcher.status cancel RUN_OR_SWEEP_DIR  # scancel its jobs
    python -m launcher.status [logs|cancel] LOGIN:RUN_DIR  # a run submitted over SSH, on its login node
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from launcher.config.prog import prog
from launcher.config.spec import saved_login
from launcher.slurm.cluster import SlurmError
from launcher.views.ranklogs import RankError, check_rank, every_rank_log, rank_log, world_size
from launcher.views.runstate import (
    cancel_counts,
    dependency_lines,
    ended,
    fault_lines,
    forecast_lines,
    format_table,
    runs_of,
    table,
    tail,
)


def watch(path: Path, interval: float, out=sys.stdout) -> None:
    """Print the table every ``interval`` seconds until every submitted job
    has ended (then once more, final); the screen is cleared on a terminal."""
    while True:
        rows = table(path)
        if out.isatty():
            out.write("\033[2J\033[H")
        faults = "".join(f"{line}\n" for line in fault_lines(rows))
        # The forecast its own paragraph, after the table and its fault lines.
        ahead = "".join(f"{line}\n" for line in forecast_lines(rows))
        ahead = f"\n{ahead}" if ahead else ""
        out.write(f"{time.strftime('%H:%M:%S')}  {path}\n{format_table(rows)}\n{faults}{ahead}\n")
        out.flush()
        if all(ended(r) for r in rows):
            return
        time.sleep(interval)


def show_logs(path: Path, lines: int, rank: int | None) -> int:
    """Tail each run's output of global rank ``rank`` (None: every rank's,
    each file once, labelled): a Slurm job's task file, a local run's
    logs/rank<N>.log; under torchrun the node's that hosts the rank.
    A rank a run does not have is refused before anything is shown."""
    entries = runs_of(path)
    if rank is not None:
        for point, run_dir, _ in entries:
            check_rank(run_dir, rank, point)
    for point, run_dir, job_id in entries:
        world = world_size(run_dir)
        where = f"job {job_id}" if job_id else "local run"
        login = saved_login(run_dir) if job_id else ""
        logs = every_rank_log(run_dir, job_id) if rank is None else [rank_log(run_dir, job_id, rank)]
        if login and not any(rl.path for rl in logs):  # its job writes on the cluster: not a missing output
            print(f"==> {point} {where}: no output here; the job writes it on the cluster behind {login}, "
                  "which meshrun does not read over SSH yet")  # fmt: skip
            continue
        others = " (--rank N, --rank all: the others)" if rank is not None and (world or 1) > 1 else ""
        for rl in logs:
            print(
                f"==> {point} {where}, {rl.label(world, every=rank is None)}{others}: {rl.path or 'no output yet'}"
            )
            if rl.path:
                print(tail(rl.path, lines), end="")
    return 0


def cancel_runs(path: Path) -> int:
    """Cancel each run's Slurm job, or stop each local run; 1 when there was
    nothing to cancel in any of them (each said why)."""
    cancelled, refused = cancel_counts(path)
    return 1 if refused and not cancelled else 0


def _parser(action: str) -> argparse.ArgumentParser:
    usage = f"python -m launcher.status {action}".replace(" show", "")
    what = {
        "show": "State, step, loss, tokens/s and goodput of a run or of every sweep point.",
        "logs": "The last lines of a run's output (of each sweep point's): a rank's (--rank N, default 0; "
        "under torchrun the log of the node that hosts it) or every rank's (--rank all), from its Slurm "
        "task's or local log.",
        "cancel": "Cancel a run's Slurm job (every sweep point's), or stop a local run by its launcher pid.",
    }[action]
    # The other actions, said in each one's --help: words before the path under
    # python -m launcher.status, commands of their own under meshrun.
    under_meshrun = prog("").startswith("meshrun")
    others = {"show": "status", "logs": "logs", "cancel": "cancel"} if under_meshrun else {
        "show": "python -m launcher.status", "logs": "python -m launcher.status logs",
        "cancel": "python -m launcher.status cancel"}  # fmt: skip
    also = "also: " + "; ".join(
        f"{'meshrun ' if under_meshrun else ''}{w} PATH" for a, w in others.items() if a != action
    )
    parser = argparse.ArgumentParser(prog=prog(usage), description=what, epilog=also)
    parser.add_argument("path", nargs="?", default=".", help="run dir or sweep dir (default: .)")
    if action == "logs":  # only logs reads lines
        parser.add_argument("-n", "--lines", type=int, default=20, help="lines to show (default 20)")
        parser.add_argument(
            "--rank",
            default="0",
            metavar="N|all",
            help="the program's global rank whose output (default 0; under torchrun the log of the node "
            "that hosts it), or all: every rank's, each file once",
        )
    if action == "show":
        parser.add_argument(
            "--watch",
            type=float,
            nargs="?",
            const=10.0,
            metavar="SECONDS",
            help="refresh every SECONDS (default 10) until every job has ended",
        )
        parser.add_argument("--png", metavar="FILE", help="also plot loss and tokens/s per point to FILE")
    return parser


def _remote(action: str, target: str, argv: list[str], parser: argparse.ArgumentParser) -> int | None:
    """LOGIN:RUN_DIR (a run submitted over SSH): the same action on the
    login node (launcher/views/remoterun.py); None: a path here."""
    from launcher.config.validate import ConfigError
    from launcher.slurm.remote import RemoteError
    from launcher.views.remoterun import follow_remote, remote_target

    try:
        found = remote_target(target)
        if found is None:
            return None
        if any(a.startswith(("--watch", "--png")) for a in argv):
            parser.error("--watch and --png read the run here: over SSH, run them on the login node")
        rest = [a for a in argv if a != target]
        return follow_remote(*found, [*([action] if action != "show" else []), *rest])
    except ConfigError as e:
        print(f"meshrun: error: {e}", file=sys.stderr)
        return 2
    except RemoteError as e:
        print(f"meshrun: {e}", file=sys.stderr)
        return 3


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    action = "show"
    if argv and argv[0] in ("logs", "cancel", "show"):
        action = argv.pop(0)
    parser = _parser(action)
    args = parser.parse_args(argv)
    if not Path(args.path).exists():
        remote = _remote(action, args.path, argv, parser)
        if remote is not None:
            return remote
    path = Path(args.path).resolve()
    try:
        if action == "logs":
            if args.rank != "all" and not args.rank.lstrip("-").isdigit():
                parser.error(f"--rank {args.rank!r} is not a rank: give a rank number (0, 1, ...) or all")
            try:
                return show_logs(path, args.lines, None if args.rank == "all" else int(args.rank))
            except RankError as e:
                parser.error(str(e))
        if action == "cancel":
            return cancel_runs(path)
        if args.watch is not None:
            if args.watch <= 0:
                parser.error(f"--watch={args.watch:g} is invalid: give a refresh interval > 0 seconds")
            try:
                watch(path, args.watch)
            except KeyboardInterrupt:
                return 130
        else:
            rows = table(path)
            print(format_table(rows))
            for line in [*forecast_lines(rows), *fault_lines(rows), *dependency_lines(rows)]:
                print(line)
        if args.png:
            from launcher.views.plot import plot_runs

            n = plot_runs([(p, d) for p, d, _ in runs_of(path)], args.png)
            print(f"meshrun: plotted {n} run(s) to {args.png}")
        return 0
    except SlurmError as e:
        print(f"meshrun: {e}", file=sys.stderr)
        return 3
    except ValueError as e:
        print(f"meshrun: {e}", file=sys.stderr)
        return 2
