"""Friendly messages for command-line overrides Hydra's grammar cannot read.

Hydra rejects an unquoted value with characters outside its grammar
(``model=7б``, ``launcher.job_name=café-λ``) with a lexer error and a caret,
before meshrun sees the config. :func:`grammar_error` parses the overrides
the same way first and, for the first one Hydra would reject, says how to
quote it and, for a config group, which options exist.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from collections.abc import Sequence
from pathlib import Path

from launcher.config.schema import GROUPS, RunConfig
from launcher.config.userconf import CONF_DIR, user_conf_dir


def group_options(group: str) -> list[str]:
    """The options of a config group: the YAML files in conf/<group>/ and
    in the user's config dir (presets ``meshrun init`` wrote)."""
    dirs = (Path(CONF_DIR) / group, user_conf_dir() / group)
    return sorted({p.stem for d in dirs for p in d.glob("*.yaml")})


def _nearest(word: str, choices: Sequence[str]) -> str | None:
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def _unknown_key(key: str) -> str | None:
    """The message for a dotted key the schema has no field for, or None
    (known, or below a field that is not a dataclass: a dict takes any key)."""
    cls: typing.Any = RunConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            where = ".".join(parts[:i])
            near = _nearest(part, names)
            full = [f"{where}.{n}" if where else n for n in names]
            if near:
                return f"unknown key {key!r}: did you mean {('.'.join([*parts[:i], near]))!r}?"
            scope = f"under {where}" if where else "at the top level"
            return f"unknown key {key!r}: no field {part!r} {scope}; valid: {', '.join(full)}"
        hint = typing.get_type_hints(cls)[part]
        nested = [t for t in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(t)]
        if not nested:
            return None
        cls = nested[0]
    return None


def _unknown_option(group: str, value: str) -> str | None:
    """The message for a config group option that has no YAML file, or None."""
    if re.search(r"[()\[\]{}*?$]", value):
        return None  # a sweep function, a list or an interpolation: Hydra's to judge
    options = group_options(group)
    for v in (x.strip() for x in value.split(",")):  # -m sweeps: 1b,7b
        if v and v != "null" and v not in options:
            near = _nearest(v, options)
            guess = f"did you mean {near!r}? " if near else ""
            return (
                f"unknown {group} option {v!r} ({group}={value}): {guess}choose one of {', '.join(options)}"
            )
    return None


def unknown_override(overrides: Sequence[str]) -> str | None:
    """The first override naming a key the schema lacks or a group option
    with no preset, as one message with the nearest valid name (difflib),
    or None. Hydra's own advice for these (``+modle=13b``) would append a
    key the run then refuses."""
    for text in overrides:
        key, eq, value = text.partition("=")
        if not eq or key.startswith(("+", "~")) or key.split(".")[0] == "hydra":
            continue  # an append or a delete says the key is new or optional on purpose
        key = key.split("@")[0]
        msg = _unknown_option(key, value) if key in GROUPS else _unknown_key(key)
        if msg:
            return msg
    return None


def unknown_in_argv(argv: Sequence[str]) -> str | None:
    """:func:`unknown_override` of a command line's overrides (flags removed)."""
    return unknown_override(_overrides(argv))


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


def quote_value(item: str) -> str:
    """``item`` as one quoted value of Hydra's override grammar (as typed when quoted already)."""
    if len(item) >= 2 and item[0] == item[-1] and item[0] in "'\"":
        return item  # quoted already
    return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _quoted(key: str, value: str) -> str:
    """The override with its value quoted, inside shell quotes; a list's
    items each (a quoted whole list would be one string, not a list)."""
    if value.startswith("[") and value.endswith("]") and "[" not in value[1:-1]:
        items = ",".join(quote_value(x.strip()) for x in value[1:-1].split(","))
        return f"each item (inside shell quotes): '{key}=[{items}]'"
    return f"the value (inside shell quotes): '{key}={quote_value(value)}'"


def explain(text: str) -> str:
    key, eq, value = text.partition("=")
    name = re.sub(r"^[+~]+", "", key).split("@")[0]
    if not eq:
        return f"cannot read the override {text!r}: overrides are key=value (e.g. model=7b, train.steps=100)"
    msg = (
        f"cannot read the override {text!r}: its value has characters Hydra's override grammar accepts "
        f"only in quotes; quote {_quoted(key, value)}"
    )
    if name in GROUPS:
        msg += f"; {name} is a config group: choose one of {', '.join(group_options(name))}"
    return msg
