"""``meshrun COMMAND [ARGS...]``: the launcher's commands as one family.

Each command is the ``python -m launcher...`` module it names (those keep
working as documented); ``meshrun COMMAND --help`` shows its own flags. The
console script ``meshrun`` (pyproject) points here; ``python -m launcher.cli``
(launcher/cli/__main__.py) is the same. Importing this module imports neither torch nor Hydra.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

PROG = "meshrun"


@dataclass(frozen=True)
class Command:
    module: str  # what it runs: python -m <module>
    summary: str
    prefix: tuple[str, ...] = ()  # arguments put before the user's (status actions)


COMMANDS: dict[str, Command] = {
    "run": Command("launcher.commands.run", "compose, plan and launch a run or a -m sweep (Hydra overrides)"),
    "status": Command(
        "launcher.commands.status",
        "table of a run or every sweep point; --watch refreshes, --png plots curves",
    ),
    "logs": Command(
        "launcher.commands.status",
        "tail a run's (or each sweep point's) output: any rank's (--rank N|all), Slurm job or local logs",
        ("logs",),
    ),
    "cancel": Command(
        "launcher.commands.status", "cancel a run's or a sweep's Slurm jobs, or stop a local run", ("cancel",)
    ),
    "fleet": Command(
        "launcher.commands.fleet",
        "every run under a runs root: progress, goodput, cost, QOS share; --serve a web page",
    ),
    "predict": Command("launcher.commands.predict", "predicted step time, MFU and breakdown (-m sweeps)"),
    "cost": Command("launcher.commands.cost", "cost on-demand / reserved / on-prem per preset (--png chart)"),
    "preflight": Command("launcher.commands.preflight", "check this node (or a job's nodes) before training"),
    "nccl": Command("launcher.commands.nccl", "the NCCL settings a cluster exports, each with its reason"),
    "qos-admin": Command("launcher.commands.qos_admin", "render team QOS presets for slurm.conf / sacctmgr"),
    "nodes": Command(
        "launcher.commands.nodes", "nodes the bad-node ledger excludes, with the admin's DRAIN line"
    ),
    "init": Command(
        "launcher.commands.init", "write a cluster preset and QOS presets from the Slurm cluster here"
    ),
    "image": Command(
        "launcher.commands.image", "build the Enroot image (.sqsh + digest) a run's tasks start from"
    ),
    "snapshot": Command(
        "launcher.commands.snapshot", "what a run's code snapshot would pack (--list: every file)"
    ),
    "rerun": Command(
        "launcher.commands.rerun",
        "a run again in a new run dir: same code snapshot and config, overrides on top",
    ),
    "pipeline": Command(
        "launcher.commands.pipeline", "submit a YAML of named stages, each after those it depends on"
    ),
    "diff": Command(
        "launcher.commands.diff", "what differs between two runs: config, code, packages, image, data, loss"
    ),
}


def _help_text() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name.ljust(width)}  {c.summary}" for name, c in COMMANDS.items()]
    return (
        "commands:\n"
        + "\n".join(lines)
        + f"\n\n'{PROG} COMMAND --help' shows a command's flags. Each command is also\n"
        "'python -m MODULE' (run: python -m launcher; status: python -m launcher.status)."
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="meshrun: Slurm-native training runs from one command.",
        epilog=_help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    ap.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help="one of the commands below")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")
    return ap


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("meshrun")
    except PackageNotFoundError:
        return "(not installed)"


def _entry(name: str) -> Callable[[list[str]], int] | None:
    """The command's ``main(argv)``; None when its module is not in this checkout."""
    try:
        module = importlib.import_module(COMMANDS[name].module)
    except ModuleNotFoundError as e:
        if e.name != COMMANDS[name].module:
            raise
        return None
    return module.main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        # --help, --version, a missing or an unknown command: argparse answers
        # (an unknown command is refused naming the valid ones).
        _parser().parse_args(argv)
        return 2  # not reached: a command in COMMANDS took the other branch
    # Everything after the command is the command's own (its --help included).
    args = argparse.Namespace(command=argv[0], args=argv[1:])
    cmd = COMMANDS[args.command]
    entry = _entry(args.command)
    if entry is None:
        # A hook: the command's module is built separately and plugs in here.
        print(
            f"{PROG} {args.command}: {cmd.summary}\n"
            f"{PROG}: '{args.command}' is not available in this version ({cmd.module} is not installed)",
            file=sys.stderr,
        )
        return 0 if {"-h", "--help"} & set(args.args) else 2
    from launcher.config.prog import set_command

    set_command(args.command)  # its usage and --help say "meshrun <command>"
    try:
        code = entry([*cmd.prefix, *args.args])
    finally:
        set_command(None)
    return int(code or 0)
