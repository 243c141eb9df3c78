"""The name a command's usage and --help show: ``meshrun X`` when it runs
through the ``meshrun`` command family (launcher/cli/ sets it), else the
``python -m`` module it was started as."""

from __future__ import annotations

import re

_command: str | None = None


def set_command(name: str | None) -> None:
    """launcher/cli/: the ``meshrun`` subcommand now running (None: none)."""
    global _command
    _command = name


def prog(module_usage: str) -> str:
    """``meshrun <command>`` under meshrun, else ``module_usage``."""
    return f"meshrun {_command}" if _command else module_usage


# reST a docstring may hold: ``literal`` and :role:`target` (shown as plain text in --help).
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")
# A docstring's leading usage: ``python -m x ARGS`` (``meshrun x``) or ``meshrun x`` / ``python -m x``.
_USAGE = re.compile(r"^``[^`]+``(\s*\(``[^`]+``\))?(\s*/\s*``[^`]+``)?\s*:\s*")


def plain(text: str) -> str:
    """``text`` without reST markup."""
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text))


def describe(doc: str | None) -> str:
    """A command's --help description from its module docstring: the whole
    first paragraph (its first line alone can stop mid-sentence) on one
    line, without the leading usage (argparse prints its own) or reST."""
    first = (doc or "").strip().split("\n\n")[0]
    text = plain(_USAGE.sub("", " ".join(first.split())))
    return text[:1].upper() + text[1:]
