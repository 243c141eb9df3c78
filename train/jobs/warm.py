"""A warm spare's wait (launcher/config/warmspare.py): the imports a
replacement would pay for after a fault, done before it, then one line on
standard input that makes this process the lost rank's replacement."""

from __future__ import annotations

import os
import sys
import time

from launcher.config.health import node_name
from launcher.config.warmspare import SPARE_ENV, read_assignment


def take_rank() -> bool:
    """Load what a rank needs, wait for the assignment, become that rank
    (its variables in the environment, its output files); False at end of
    input (no rank was needed)."""
    t0 = time.perf_counter()
    # torch._dynamo: imported on first use by the trainer's build (fully_shard,
    # the optimizer), 212 modules, 0.4 s here, on a replacement's critical path.
    import torch._dynamo  # noqa: F401

    import train.jobs.entry  # noqa: F401 - torch, the trainer, the loop: the start-up a replacement saves
    import train.loop.resilient  # noqa: F401

    print(
        f"meshrun train: warm spare on {node_name()} (pid {os.getpid()}): loaded in "
        f"{time.perf_counter() - t0:.1f} s, waiting for a rank",
        file=sys.stderr,
        flush=True,
    )
    line = sys.stdin.readline()
    if not line.strip():
        return False
    env, outputs = read_assignment(line)
    for key, fd in (("stdout", 1), ("stderr", 2)):
        if key in outputs:  # the rank's own files (Slurm: srun wrote them for the lost task)
            try:
                with open(outputs[key], "a") as f:
                    os.dup2(f.fileno(), fd)
            except OSError as e:  # a container that does not see the path: its own output, said
                print(f"meshrun train: warm spare: output stays here ({e})", file=sys.stderr, flush=True)
    os.environ.update(env)  # the rank's variables and its incarnation (MESHRUN_REPLACEMENT)
    del os.environ[SPARE_ENV]
    print(
        f"meshrun train: warm spare (pid {os.getpid()}) takes rank {env['RANK']}", file=sys.stderr, flush=True
    )
    return True
