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
Standard library only."""

from __future__ import annotations

import json
import os

SPARE_ENV = "MESHRUN_WARM_SPARE"
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
OUTPUT_KEYS = ("stdout", "stderr")


def is_spare() -> bool:
    return os.environ.get(SPARE_ENV) == "1"


def assignment(rank: int, world: int, ranks_per_node: int, outputs: dict[str, str] | None = None) -> str:
    """The line that gives a spare ``rank`` (``outputs``: stdout/stderr paths to append to)."""
    doc: dict[str, str] = {
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
    WORLD_SIZE, outputs absolute paths. ValueError names what is wrong."""
    doc = json.loads(line)
    if not isinstance(doc, dict) or set(doc) - set(RANK_VARS) - set(OUTPUT_KEYS) or set(RANK_VARS) - set(doc):
        raise ValueError(
            f"a spare's assignment needs exactly {RANK_VARS} (+ {OUTPUT_KEYS}), got {sorted(doc)}"
        )
    env = {k: doc[k] for k in RANK_VARS}
    if not all(isinstance(v, str) and v.isdigit() for v in env.values()) or int(env["RANK"]) >= int(
        env["WORLD_SIZE"]
    ):
        raise ValueError(f"a spare's assignment has a bad rank variable: {env}")
    outputs = {k: doc[k] for k in OUTPUT_KEYS if k in doc}
    if not all(isinstance(v, str) and os.path.isabs(v) for v in outputs.values()):
        raise ValueError(f"a spare's output paths must be absolute: {outputs}")
    return env, outputs
