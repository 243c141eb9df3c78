"""One rank of the interop test: build the run's model with the trainer's
own builder (layout, HF weights or checkpoint as the spec says), run
``<run_dir>/tokens.pt`` through it and, on rank 0, save the logits to
``<run_dir>/logits.pt``. Started by tests/local/test_jobs_hf.py with torchrun-style
environment variables."""

from __future__ import annotations

import sys

import torch

from launcher.config.spec import load_spec
from train.loop import weights
from train.loop.build import build_trainer
from train.models import hf
from train.parallel.dist import dist_info_from_env, init_process_group, shutdown
from train.parallel.mesh import ParallelDims


def check_stage_params(t, run_dir: str, rank: int) -> None:
    """{HF key: max |difference|} of this rank's parameters, in HF layout,
    against the safetensors file, to <run_dir>/stage_rank<r>.json."""
    import json

    from safetensors.torch import load_file
    from torch.distributed.tensor import DTensor

    ref = load_file(f"{t.spec.cfg.job.hf_path}/model.safetensors")
    out = {}
    for part in t.parts:
        for raw, p in part.named_parameters():
            name = hf.canonical_name(raw)
            full = p.full_tensor() if isinstance(p, DTensor) else p.detach()
            key = hf.hf_key(name)
            out[key] = (hf.to_hf(name, full, t.spec.cfg.model) - ref[key]).abs().max().item()
    with open(f"{run_dir}/stage_rank{rank}.json", "w") as f:
        json.dump(out, f)


def main(run_dir: str) -> None:
    spec = load_spec(run_dir)
    info = dist_info_from_env(spec.plan.device)
    dims = ParallelDims.from_plan(spec.plan, info.world_size)
    init_process_group(info)
    try:
        t = build_trainer(spec, info, dims)
        tokens = torch.load(f"{run_dir}/tokens.pt")
        with open(f"{run_dir}/bytes_read_rank{info.rank}", "w") as f:
            f.write(str(weights.LAST_BYTES_READ))
        if dims.pp > 1:
            # A pipeline rank holds some layers: compare them with the files.
            check_stage_params(t, run_dir, info.rank)
            return
        with torch.no_grad():
            logits = t.parts[0](tokens)
        if info.is_main:
            torch.save(logits, f"{run_dir}/logits.pt")
    finally:
        shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
