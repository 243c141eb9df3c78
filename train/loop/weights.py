"""A job's starting weights: a meshrun checkpoint's model (any layout it was
saved at) or Hugging Face weights (job.checkpoint / job.hf_path), for
finetune, eval and generate."""

from __future__ import annotations

import contextlib
from pathlib import Path

from torch import nn

from launcher.config.validate import ConfigError
from train.models.hf import load_hf_weights

# Bytes of HF weights this rank read in its last load_job_weights (tests check
# that each rank reads only its shard).
LAST_BYTES_READ = 0


def checkpoint_steps(path: str, all_steps: bool) -> list[tuple[int, str]]:
    """(step, dir) of the complete checkpoints ``path`` names: one step dir
    (it holds manifest.json), or a run dir's checkpoints (every one, or the
    newest). ValueError naming job.checkpoint when there is none."""
    from launcher.config.spec import load_spec
    from train.checkpoint.manifest import MANIFEST, list_steps, parse_step_dir, step_dir_name

    p = Path(path)
    if (p / MANIFEST).is_file():
        step = parse_step_dir(p.name)
        return [(step if step is not None else 0, str(p))]
    roots = [p / "checkpoints"]
    with contextlib.suppress(OSError, ValueError, AssertionError, EOFError):
        roots.insert(0, Path(load_spec(p).checkpoint_dir))
    for root in roots:
        steps = list_steps(root)
        if steps:
            chosen = steps if all_steps else steps[-1:]
            return [(s, str(root / step_dir_name(s))) for s in chosen]
    raise ConfigError(
        f"job.checkpoint={path!r} is invalid: no complete checkpoint (a step_N dir with manifest.json) in it"
    )


def load_checkpoint_model(parts: list[nn.Module], step_dir: str, *, no_dist: bool = False) -> None:
    """Only the model weights of a meshrun checkpoint (any layout it was
    saved at) into ``parts``; optimizer and loader state are left alone."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from train.loop.state import ModelState

    state = {"model": ModelState(parts)}
    dcp.load(
        state, storage_reader=dcp.FileSystemReader(step_dir), no_dist=no_dist or not dist.is_initialized()
    )


def load_job_weights(parts: list[nn.Module], spec, *, no_dist: bool = False) -> str:
    """The starting weights of a finetune / eval / generate run into
    ``parts``: job.checkpoint (a meshrun checkpoint) or job.hf_path. Returns
    what was loaded, for the log."""
    j, m = spec.cfg.job, spec.cfg.model
    if j.checkpoint:
        step, step_dir = checkpoint_steps(j.checkpoint, all_steps=False)[-1]
        load_checkpoint_model(parts, step_dir, no_dist=no_dist)
        return f"checkpoint {step_dir}"
    read = sum(load_hf_weights(part, j.hf_path, m) for part in parts)
    global LAST_BYTES_READ  # read by tests: what this rank read
    LAST_BYTES_READ = read
    return f"Hugging Face weights {j.hf_path} ({read / 1e6:.2f} MB read by this rank)"
