"""Slurm node names read back from shared files (the runs root's bad-node
ledger, a run's ``faults.jsonl``, preflight results, heartbeats): a name is
used (``#SBATCH --exclude``, ``ExcNodeList=``, ``srun --nodelist``,
``scontrol update NodeName=``) only when it is one plain host name.

A runs root is shared by a team, so its files are input from other users: a
name holding a newline would end an ``#SBATCH`` line and run the rest as a
command in the next user's batch script; a range (``gpu[001-512]``) or a
list would exclude or drain a whole partition. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# A host name (RFC 1123 labels, plus the "_" Slurm accepts): letters, digits,
# "-", "_", "."; no leading "-" or "." (an option, a relative name), no
# brackets, commas, spaces, quotes, shell metacharacters or control characters.
NODE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}", re.ASCII)
RULE = "a Slurm host name (letters, digits, '-', '_', '.'; no range, list, space or control character)"


def is_node_name(name: object) -> bool:
    return isinstance(name, str) and NODE_NAME.fullmatch(name) is not None


def problem(name: object) -> str | None:
    """Why ``name`` is not one node's name, or None when it is."""
    if is_node_name(name):
        return None
    return f"node name {name!r} is not {RULE}"


def node_list(names: Iterable[str]) -> str:
    """The comma-separated list of ``names`` for Slurm (``--exclude``,
    ``ExcNodeList=``), sorted and without repeats; every name checked: a bad
    one raises ValueError (the readers skip such names, so none gets here)."""
    names = sorted(set(names))
    for n in names:
        if (why := problem(n)) is not None:
            raise ValueError(why)
    return ",".join(names)
