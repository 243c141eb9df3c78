"""The name a command's usage and --help show: ``meshrun X`` when it runs
through the ``meshrun`` command family (launcher/cli.py sets it), else the
``python -m`` module it was started as."""

from __future__ import annotations

_command: str | None = None


def set_command(name: str | None) -> None:
    """launcher/cli.py: the ``meshrun`` subcommand now running (None: none)."""
    global _command
    _command = name


def prog(module_usage: str) -> str:
    """``meshrun <command>`` under meshrun, else ``module_usage``."""
    return f"meshrun {_command}" if _command else module_usage
