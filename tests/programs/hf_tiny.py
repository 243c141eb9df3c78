"""Test data for a Hugging Face program (tests/cluster/test_thirdparty_trl_cluster.py),
run with that program's own venv: a tiny random Llama with a word-level
tokenizer saved as ``save_pretrained`` writes them, and a JSON-lines text
dataset, both local (nothing is downloaded).

    python hf_tiny.py PROJECT_DIR   # -> PROJECT_DIR/model, PROJECT_DIR/data/train.jsonl
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def main(root: Path) -> None:
    words = [f"w{i}" for i in range(300)]
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {t: i for i, t in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    model_dir = root / "model"
    fast.save_pretrained(model_dir)
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    LlamaForCausalLM(cfg).save_pretrained(model_dir)
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    with open(data / "train.jsonl", "w") as f:
        for _ in range(20_000):  # more than the run reads: one epoch, the bar's count is the global step
            f.write(json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(8, 40)))}) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
