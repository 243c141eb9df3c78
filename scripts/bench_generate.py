#!/usr/bin/env python
"""job=generate's decoder against transformers' ``generate``, side by side.

Same model (a random Llama built by transformers from a config and saved
with save_pretrained, then loaded by meshrun's HF loader), same prompts,
same batches, same greedy decoding, same machine and threads, in one
process. Each side runs every batch ``--repeats`` times, alternating, and
its best pass counts (other helpers share this machine's cores). Also checks
that both produce identical tokens.

    python scripts/bench_generate.py --threads 1     # CPU, the tiny preset's shape
    python scripts/bench_generate.py --dim 256 --heads 8 --kv-heads 4 --vocab 4096
    python scripts/bench_generate.py --device cuda --dim 1024 --layers 8

The default model is meshrun's ``model=tiny`` shape, where per-token
overhead decides (measured here: R = 2.7). The ratio shrinks as matmuls
take over: at dim 256 / vocab 4096 on one contended CPU thread both spend
about three quarters of the time in the same GEMMs (R = 1.2-1.4).

Last line: ``bench_generate: vs_transformers=R`` (R = meshrun tokens/s /
transformers tokens/s; goal R >= 1.5).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    import transformers

    from launcher.config.schema import ModelConfig
    from launcher.plan.jobs import hf_model_shape
    from train.decode import KVDecoder, Sampling, generate_all
    from train.hf import load_hf_weights
    from train.model import Llama

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=args.dim,
        intermediate_size=args.dim * 8 // 3 // 16 * 16,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    with tempfile.TemporaryDirectory() as d:
        transformers.LlamaForCausalLM(config).save_pretrained(d)
        hf = transformers.LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).to(device).eval()
        shape = hf_model_shape(json.loads(Path(d, "config.json").read_text()))
        m = ModelConfig(name="bench", seq_len=1024, **shape)
        with torch.device("meta"):
            model = Llama(m)
        model.to_empty(device=device)
        load_hf_weights(model, d, m)
    dec = KVDecoder(model.requires_grad_(False))

    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(3, args.vocab, (int(torch.randint(8, 49, (1,), generator=g)),), generator=g).tolist()
        for _ in range(args.prompts)
    ]
    batches = [prompts[i : i + args.batch] for i in range(0, len(prompts), args.batch)]
    # No EOS: every sequence decodes max_new_tokens on both sides.
    s = Sampling(args.max_new_tokens)
    gen_cfg = transformers.GenerationConfig(
        max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )

    def ours(batch: list[list[int]]) -> list[list[int]]:
        return [ids for ids, _ in generate_all(dec, batch, s, device, slots=len(batch))]

    @torch.inference_mode()
    def theirs(batch: list[list[int]]) -> list[list[int]]:
        n = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (n - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in batch], device=device)
        out = hf.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg)
        return out[:, n:].tolist()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn, batch) -> tuple[float, list[list[int]]]:
        sync()
        t0 = time.perf_counter()
        out = fn(batch)
        sync()
        return time.perf_counter() - t0, out

    ours(batches[0])  # warm-up (allocator, kernels)
    theirs(batches[0])
    best = {"meshrun": [float("inf")] * len(batches), "transformers": [float("inf")] * len(batches)}
    same = True
    for _ in range(args.repeats):
        for i, batch in enumerate(batches):
            ta, a = timed(ours, batch)
            tb, b = timed(theirs, batch)
            best["meshrun"][i] = min(best["meshrun"][i], ta)
            best["transformers"][i] = min(best["transformers"][i], tb)
            same = same and a == b
    tokens = len(prompts) * args.max_new_tokens
    rate = {k: tokens / sum(v) for k, v in best.items()}
    print(
        f"model: dim {args.dim}, {args.layers} layers, {args.heads}/{args.kv_heads} heads, vocab {args.vocab}, "
        f"fp32 on {device}, {torch.get_num_threads()} threads; {len(prompts)} prompts of 8-48 tokens, "
        f"batch {args.batch}, {args.max_new_tokens} new tokens each, greedy"
    )
    print(f"tokens identical: {'yes' if same else 'NO'}")
    for k, v in rate.items():
        print(f"{k:>13}: {v:9,.0f} tokens/s  ({sum(best[k]):.3f} s)")
    ratio = rate["meshrun"] / rate["transformers"]
    print(f"bench_generate: vs_transformers={ratio:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
