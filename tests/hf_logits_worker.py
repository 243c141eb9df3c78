"""One rank of the interop test: build the run's model with the trainer's
own builder (layout, HF weights or checkpoint as the spec says), run
``<run_dir>/tokens.pt`` through it and, on rank 0, save the logits to
``<run_dir>/logits.pt``. Started by tests/test_jobs_hf.py with torchrun-style
environment variables."""

from __future__ import annotations

import sys

import torch

from launcher.spec import load_spec
from train.build import build_trainer
from train.dist import dist_info_from_env, init_process_group, shutdown
from train.mesh import ParallelDims


def main(run_dir: str) -> None:
    spec = load_spec(run_dir)
    info = dist_info_from_env(spec.plan.device)
    dims = ParallelDims.from_plan(spec.plan, info.world_size)
    init_process_group(info)
    try:
        t = build_trainer(spec, info, dims)
        tokens = torch.load(f"{run_dir}/tokens.pt")
        with torch.no_grad():
            logits = t.parts[0](tokens)
        if info.is_main:
            torch.save(logits, f"{run_dir}/logits.pt")
    finally:
        shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
