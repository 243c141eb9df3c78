"""Friendly messages for command-line overrides Hydra's grammar cannot read.

Hydra rejects an unquoted value with characters outside its grammar
(``model=7б``, ``launcher.job_name=café-λ``) with a lexer error and a caret,
before meshrun sees the config. :func:`grammar_error` parses the overrides
the same way first and, for the first one Hydra would reject, says how to
quote it and, for a config group, which options exist.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from launcher.config.compose import CONF_DIR
from launcher.config.schema import GROUPS


def group_options(group: str) -> list[str]:
    """The options of a config group: the YAML files in conf/<group>/."""
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


def _overrides(argv: Sequence[str]) -> list[str]:
    """The overrides among Hydra's command-line arguments (flags removed)."""
    from hydra._internal.utils import get_args_parser

    try:
        args, _ = get_args_parser().parse_known_args(list(argv))
    except SystemExit:  # a malformed flag: Hydra's own parser will say so
        return []
    return list(args.overrides or [])


def grammar_error(argv: Sequence[str]) -> str | None:
    """One message for the first override Hydra cannot parse, or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for text in _overrides(argv):
        try:
            parser.parse_overrides([text])
        except HydraException:
            return redact(explain(text), [text])
    return None


def redact(message: str, argv: Sequence[str]) -> str:
    """``message`` with the value of every credential-looking override
    masked: Hydra's own errors quote the override as typed."""
    from launcher.config.secrets import mask, secret_env_name

    for text in argv:
        key, eq, value = text.partition("=")
        if not eq or not value:
            continue
        name = key.rsplit(".", 1)[-1]
        hidden = "***" if secret_env_name(name) else mask(value)
        if hidden != value:
            message = message.replace(value, hidden)
    return message


def explain(text: str) -> str:
    key, eq, value = text.partition("=")
    name = re.sub(r"^[+~]+", "", key).split("@")[0]
    if not eq:
        return f"cannot read the override {text!r}: overrides are key=value (e.g. model=7b, train.steps=100)"
    quoted = value.replace("\\", "\\\\").replace('"', '\\"')
    msg = (
        f"cannot read the override {text!r}: its value has characters Hydra's override grammar accepts "
        f"only in quotes; quote the value (inside shell quotes): '{key}=\"{quoted}\"'"
    )
    if name in GROUPS:
        msg += f"; {name} is a config group: choose one of {', '.join(group_options(name))}"
    return msg
