#!/usr/bin/env python
"""job=generate's decoder against transformers' ``generate``, side by side.

Same model (a random Llama built by transformers from a config and saved
with save_pretrained, then loaded by meshrun's HF loader), same prompts,
same greedy decoding, same machine and threads, in one process. Each side
runs the whole prompt set ``--repeats`` times, alternating, and its best
pass counts (other processes share this machine's cores). Both must produce
identical tokens (asserted: exit 1 otherwise).

Two cases, each printing its ratio R = meshrun tokens/s / transformers
tokens/s (tokens: the completions' tokens, the same on both sides; per
second of this process's CPU time on a CPU with ``--threads 1``, where that
is the work itself and other tenants of the cores do not skew it; per wall
second otherwise; both ratios are printed):

- tiny: meshrun's ``model=tiny`` shape (dim 64, vocab 256), every prompt 48
  new tokens, static batches of ``--batch``: per-token overhead decides.
- realistic: dim 512, 8 query / 2 key-value heads (GQA), vocab 32000,
  prompts of 16-128 tokens and completions of 8-128 tokens (each prompt its
  own limit, as EOS would end them). meshrun decodes with continuous
  batching (``--batch`` sequences in flight, a finished slot refilled at
  once); transformers' generate takes static batches of ``--batch`` prompts
  in input order and decodes each until its longest completion is done,
  each sequence then cut at its own limit (its stopping criteria end a
  batch only when every sequence has ended). 64 prompts: a file of prompts,
  not one batch. At this width a decode step of 8 sequences is bound by
  reading the weights (the 32000 x 512 output matrix alone is 65 MB), so it
  costs about the same for 1 or 8 live sequences: the lead comes from fewer
  steps, and shrinks when the set is so small that its tail (the last few
  sequences draining with no prompt left to refill) is a large share.

    python scripts/bench_generate.py --threads 1
    python scripts/bench_generate.py --case realistic --layers 8 --device cuda
    python scripts/bench_generate.py --case realistic --new-tokens 64,64   # decoder alone
    python scripts/bench_generate.py --quick   # seconds (CI)

``--quick``: both cases with 8 prompts, one pass each side, 1 thread, and
the realistic case cut to 1 layer and 8-16 new tokens (its ratio then says
little: the per-token overhead, not the batching, decides).

Last line: ``bench_generate: vs_transformers=R`` of the realistic case
(goal R >= 1.5).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

CASES = {
    "tiny": {
        "dim": 64,
        "layers": 4,
        "heads": 4,
        "kv_heads": 2,
        "vocab": 256,
        "prompt_tokens": (8, 48),
        "new_tokens": (48, 48),
        "prompts": 32,
    },
    "realistic": {
        "dim": 512,
        "layers": 4,
        "heads": 8,
        "kv_heads": 2,
        "vocab": 32000,
        "prompt_tokens": (16, 128),
        "new_tokens": (8, 128),
        "prompts": 64,
    },
}


def run_case(name: str, shape: dict, args: argparse.Namespace) -> tuple[float, bool]:
    """(R, same tokens) of one case; prints its lines."""
    import transformers

    from launcher.config.schema import ModelConfig
    from launcher.plan.jobs import hf_model_shape
    from train.jobs.decode import KVDecoder, Sampling, generate_all
    from train.models.hf import load_hf_weights
    from train.models.llama import Llama

    device = torch.device(args.device)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=shape["dim"],
        intermediate_size=shape["dim"] * 8 // 3 // 16 * 16,
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        vocab_size=shape["vocab"],
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    with tempfile.TemporaryDirectory() as d:
        transformers.LlamaForCausalLM(config).save_pretrained(d)
        hf = transformers.LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).to(device).eval()
        m = ModelConfig(
            name="bench", seq_len=1024, **hf_model_shape(json.loads(Path(d, "config.json").read_text()))
        )
        with torch.device("meta"):
            model = Llama(m)
        model.to_empty(device=device)
        load_hf_weights(model, d, m)
    dec = KVDecoder(model.requires_grad_(False))

    g = torch.Generator().manual_seed(1)
    lo, hi = shape["prompt_tokens"]
    prompts = [
        torch.randint(
            3, shape["vocab"], (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g
        ).tolist()
        for _ in range(args.prompts or shape["prompts"])
    ]
    lo, hi = shape["new_tokens"]
    limits = [int(torch.randint(lo, hi + 1, (1,), generator=g)) for _ in prompts]
    batches = [list(range(i, min(i + args.batch, len(prompts)))) for i in range(0, len(prompts), args.batch)]
    # No EOS: each sequence decodes exactly its limit on both sides.
    s = Sampling(max(limits))

    def ours() -> list[list[int]]:
        return [ids for ids, _ in generate_all(dec, prompts, s, device, slots=args.batch, limits=limits)]

    @torch.inference_mode()
    def theirs() -> list[list[int]]:
        out: list[list[int]] = []
        for batch in batches:
            ps = [prompts[i] for i in batch]
            n = max(len(p) for p in ps)
            ids = torch.tensor([[0] * (n - len(p)) + p for p in ps], device=device)
            mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in ps], device=device)
            cfg = transformers.GenerationConfig(
                max_new_tokens=max(limits[i] for i in batch),
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            gen = hf.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)[:, n:].tolist()
            out += [row[: limits[i]] for i, row in zip(batch, gen, strict=True)]
        return out

    def timed(fn) -> tuple[float, float, list[list[int]]]:
        """(wall s, this process's CPU s, result). On a CPU shared with other
        processes the CPU seconds are the steadier figure (1 thread: the
        work itself); R uses the wall time."""
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, time.process_time() - c0, out

    # Warm-up (allocator, kernels) on the first batch's prompts.
    generate_all(dec, prompts[: args.batch], Sampling(4), device, slots=args.batch)
    with torch.inference_mode():
        hf.generate(
            input_ids=torch.tensor([prompts[0]], device=device),
            generation_config=transformers.GenerationConfig(
                max_new_tokens=4, do_sample=False, pad_token_id=0
            ),
        )
    best = {"meshrun": float("inf"), "transformers": float("inf")}
    cpu = dict(best)
    same = True
    for _ in range(args.repeats):
        for k, fn in (("meshrun", ours), ("transformers", theirs)):
            wall, used, out = timed(fn)
            best[k], cpu[k] = min(best[k], wall), min(cpu[k], used)
            if k == "meshrun":
                a = out
        same = same and a == out
    tokens = sum(limits)
    # On a CPU with one torch thread this process's CPU seconds are the work
    # itself, steady while other processes share the cores; elsewhere wall.
    basis = "CPU" if device.type == "cpu" and torch.get_num_threads() == 1 else "wall"
    rate = {k: tokens / (cpu[k] if basis == "CPU" else best[k]) for k in best}
    p_lo, p_hi = shape["prompt_tokens"]
    n_lo, n_hi = shape["new_tokens"]
    print(
        f"[{name}] dim {shape['dim']}, {shape['layers']} layers, {shape['heads']}/{shape['kv_heads']} heads, "
        f"vocab {shape['vocab']}, fp32 on {device}, {torch.get_num_threads()} threads; {len(prompts)} prompts "
        f"of {p_lo}-{p_hi} tokens, {n_lo}-{n_hi} new tokens each ({tokens} in all), {args.batch} in flight, greedy"
    )
    print(f"[{name}] tokens identical: {'yes' if same else 'NO'}")
    for k, v in rate.items():
        print(
            f"[{name}] {k:>13}: {v:9,.0f} tokens/s per {basis} second  ({best[k]:.3f} s wall, {cpu[k]:.3f} s CPU)"
        )
    ratio = rate["meshrun"] / rate["transformers"]
    print(
        f"[{name}] ratio by wall time {best['transformers'] / best['meshrun']:.2f}, by CPU time "
        f"{cpu['transformers'] / cpu['meshrun']:.2f}; R uses {basis}"
    )
    return ratio, same


# --quick: both cases, small; tokens still compared.
QUICK = {"threads": 1, "prompts": 8, "repeats": 1, "layers": 1, "new_tokens": "8,16"}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--case", choices=("both", *CASES), default="both")
    ap.add_argument("--layers", type=int, default=0, help="layers of the realistic case (0: 4)")
    ap.add_argument(
        "--new-tokens",
        default="",
        help="LO,HI completion lengths of the realistic case (default 8,128; 128,128: no length spread)",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--prompts", type=int, default=0, help="prompts per case (0: tiny 32, realistic 64)")
    ap.add_argument("--batch", type=int, default=8, help="sequences decoded together")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small sizes: seconds (CI)")
    args = ap.parse_args(argv)
    if args.quick:  # re-parsed so that options given explicitly still win
        ap.set_defaults(**QUICK)
        args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.layers:
        CASES["realistic"]["layers"] = args.layers
    if args.new_tokens:
        lo, hi = (int(x) for x in args.new_tokens.split(","))
        CASES["realistic"]["new_tokens"] = (lo, hi)
    names = list(CASES) if args.case == "both" else [args.case]
    ok = True
    for name in names:
        ratio, same = run_case(name, CASES[name], args)
        ok = ok and same
        print(f"bench_generate[{name}]: vs_transformers={ratio:.2f}")
    # The last line: the realistic case's ratio (or the only case run).
    print(f"bench_generate: vs_transformers={ratio:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
