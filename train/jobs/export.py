"""``python -m train.jobs.export RUN_DIR OUT [--step N]``: a finished run's
checkpoint (one process, any layout it was saved at) -> a Hugging Face
directory (``config.json`` + ``model.safetensors`` + tokenizer files)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from train.loop.weights import checkpoint_steps, load_checkpoint_model
from train.models.hf import SAFE_SINGLE, _save, _write_side_files, hf_key, to_hf


def export_checkpoint(run_dir: str, out_dir: str, step: int | None = None, src_hf: str = "") -> str:
    """One process: the model of a meshrun checkpoint -> HF dir. Returns the
    checkpoint dir it read."""
    from launcher.config.spec import load_spec
    from train.models.llama import Llama

    spec = load_spec(run_dir)
    m = spec.cfg.model
    found = checkpoint_steps(run_dir, all_steps=True)
    if step is not None:
        found = [(s, d) for s, d in found if s == step]
        if not found:
            raise ValueError(f"no complete checkpoint of step {step} in {run_dir}")
    step_dir = found[-1][1]
    with torch.device("meta"):
        model = Llama(m)
    model.to_empty(device="cpu")
    load_checkpoint_model([model], step_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {hf_key(n): to_hf(n, p.detach().float(), m) for n, p in model.named_parameters()}
    _save(tensors, out / SAFE_SINGLE)
    _write_side_files(out, m, src_hf or getattr(getattr(spec.cfg, "job", None), "hf_path", ""))
    return step_dir


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m train.jobs.export", description="A meshrun checkpoint -> a Hugging Face directory."
    )
    ap.add_argument("run_dir", help="the run dir (its newest checkpoint unless --step)")
    ap.add_argument("out_dir")
    ap.add_argument("--step", type=int, default=None)
    ap.add_argument("--tokenizer-from", default="", help="an HF dir to copy tokenizer files from")
    args = ap.parse_args(argv)
    try:
        src = export_checkpoint(args.run_dir, args.out_dir, args.step, args.tokenizer_from)
    except (ValueError, FileNotFoundError) as e:
        print(f"meshrun export: error: {e}", file=sys.stderr)
        return 2
    print(f"meshrun export: {src} -> {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
