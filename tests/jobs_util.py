"""Shared by the job-kind tests: a small random Llama saved by transformers
(with the tiny tokenizer of tests/data/hf_tiny), token sets in data=tokens
format, and run specs composed and planned like the CLI does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from launcher.config.compose import compose
from launcher.config.spec import RunSpec
from launcher.plan.make import make_plan
from launcher.run.rundir import write_run_dir

HF_TINY = Path(__file__).parent / "data" / "hf_tiny"
VOCAB = 128


def make_hf_dir(out: Path) -> Path:
    """save_pretrained of a random LlamaForCausalLM (nothing downloaded)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=128,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(out)
    shutil.copyfile(HF_TINY / "tokenizer.json", out / "tokenizer.json")
    return out


def write_tokens(out: Path, tokens: np.ndarray, vocab: int = VOCAB) -> Path:
    """A data=tokens directory (what scripts/prepare_tokens.py writes)."""
    out.mkdir(parents=True, exist_ok=True)
    tokens.astype(np.uint16).tofile(out / "shard_00000.bin")
    index = {
        "format": "meshrun-tokens-v1",
        "dtype": "uint16",
        "vocab_size": vocab,
        "shards": [{"file": "shard_00000.bin", "num_tokens": int(tokens.size)}],
    }
    (out / "index.json").write_text(json.dumps(index))
    return out


def make_run(run_dir: Path, overrides: list[str]) -> RunSpec:
    cfg = compose(["cluster.local_processes=2", *overrides])
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(run_dir))
    write_run_dir(spec)
    return spec
