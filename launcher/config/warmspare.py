"""The warm spare's contract (launcher.warm_spare, in-process recovery):
between the launcher that holds a spare process and the trainer in it
(train/jobs/warm.py).

A warm spare is ``python -m train <run_dir>`` started with
``MESHRUN_WARM_SPARE=1`` and no rank: it loads torch and the trainer's
modules, then waits on its standard input. The launcher that holds it (the
local launcher; on Slurm the supervisor, through srun's stdin forwarding)
writes one JSON line when a rank is lost, :func:`assignment`: the rank's
identity and, on Slurm, the rank's own output files. End of input without
a line: the attempt ended without needing it, and it exits 0.

Every replacement, warm or cold, carries its **incarnation** of the rank in
``MESHRUN_REPLACEMENT`` (1 for the rank's first replacement, 2 for the
next; unset in the rank's first process): the launcher's word that a
rank's process died names the incarnation that died, so the store host
never takes the replacement that already arrived for the dead process
(train/inprocess/missing.py ``flag_dead``).
Standard library only."""

from __future__ import annotations

import json
import os

SPARE_ENV = "MESHRUN_WARM_SPARE"
REPLACEMENT_ENV = "MESHRUN_REPLACEMENT"  # the process's incarnation of its rank (0: the first process)
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
OUTPUT_KEYS = ("stdout", "stderr")


def is_spare() -> bool:
    return os.environ.get(SPARE_ENV) == "1"


def incarnation() -> int:
    """This process's incarnation of its rank: 0 for the rank's first process."""
    value = os.environ.get(REPLACEMENT_ENV, "")
    return int(value) if value.isdigit() else 0


def assignment(
    rank: int, world: int, ranks_per_node: int, incarnation: int, outputs: dict[str, str] | None = None
) -> str:
    """The line that gives a spare ``rank`` as its ``incarnation``-th replacement
    (``outputs``: stdout/stderr paths to append to)."""
    assert incarnation >= 1, incarnation
    doc: dict[str, str] = {
        REPLACEMENT_ENV: str(incarnation),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank % ranks_per_node),
        "LOCAL_WORLD_SIZE": str(ranks_per_node),
        "GROUP_RANK": str(rank // ranks_per_node),
    }
    doc.update(outputs or {})
    return json.dumps(doc) + "\n"


def read_assignment(line: str) -> tuple[dict[str, str], dict[str, str]]:
    """(the rank's variables, its output paths) of an :func:`assignment`
    line, checked: every rank variable a non-negative integer, RANK below
    WORLD_SIZE, the incarnation 1 or more, outputs absolute paths. ValueError names what is wrong."""
    doc = json.loads(line)
    needed = (*RANK_VARS, REPLACEMENT_ENV)
    if not isinstance(doc, dict) or set(doc) - set(needed) - set(OUTPUT_KEYS) or set(needed) - set(doc):
        raise ValueError(f"a spare's assignment needs exactly {needed} (+ {OUTPUT_KEYS}), got {sorted(doc)}")
    env = {k: doc[k] for k in needed}
    if (
        not all(isinstance(v, str) and v.isdigit() for v in env.values())
        or int(env["RANK"]) >= int(env["WORLD_SIZE"])
        or int(env[REPLACEMENT_ENV]) < 1
    ):
        raise ValueError(f"a spare's assignment has a bad rank variable: {env}")
    outputs = {k: doc[k] for k in OUTPUT_KEYS if k in doc}
    if not all(isinstance(v, str) and os.path.isabs(v) for v in outputs.values()):
        raise ValueError(f"a spare's output paths must be absolute: {outputs}")
    return env, outputs
