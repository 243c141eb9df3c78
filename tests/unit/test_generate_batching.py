"""Continuous batching in train/jobs/decode.py: a finished sequence's slot is
refilled at once, and mixed prompt / completion lengths (EOS and per-prompt
limits) give the same greedy tokens as decoding one prompt at a time."""

from __future__ import annotations

import torch

from launcher.config.schema import ModelConfig
from train.jobs.decode import KVDecoder, Sampling, generate_all, generate_stream
from train.models.llama import Llama, materialize_and_init

SHAPE = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 96, "vocab_size": 97}


def decoder() -> KVDecoder:
    m = ModelConfig(name="t", seq_len=128, **SHAPE)
    with torch.device("meta"):
        model = Llama(m)
    materialize_and_init(model, m, seed=3, device=torch.device("cpu"))
    return KVDecoder(model.requires_grad_(False))


def prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 97, (1 + (i * 7) % 23,), generator=g).tolist() for i in range(n)]


def test_mixed_lengths_match_one_prompt_at_a_time() -> None:
    dec, ps, cpu = decoder(), prompts(11), torch.device("cpu")
    limits = [1 + (i * 5) % 17 for i in range(len(ps))]
    alone = [
        generate_all(dec, [p], Sampling(20), cpu, slots=1, limits=[k])[0]
        for p, k in zip(ps, limits, strict=True)
    ]
    assert [len(ids) for ids, _ in alone] == limits
    # An EOS id that ends some sequences early (one each model draws mid-way).
    eos = next(ids[3] for ids, _ in alone if len(ids) > 4)
    s = Sampling(20, eos=(eos,))
    ref = [generate_all(dec, [p], s, cpu, slots=1, limits=[k])[0] for p, k in zip(ps, limits, strict=True)]
    assert any(r == "eos" for _, r in ref) and any(r == "length" for _, r in ref)
    for slots in (3, 4, 16):
        assert generate_all(dec, ps, s, cpu, slots=slots, limits=limits) == ref, slots


def test_a_finished_slot_is_refilled_at_once() -> None:
    dec, cpu = decoder(), torch.device("cpu")
    ps = prompts(6)
    steps = 0
    decode = dec.decode

    def counted(*a, **k):
        nonlocal steps
        steps += 1
        return decode(*a, **k)

    dec.decode = counted
    # Two slots: the long sequence keeps one for its 12 tokens while the five
    # short ones (2 tokens each) pass through the other, one after another.
    # Static batches of 2 would take 11 + 4 x 1 = 15 decode steps. (Each short
    # one after the first is prefilled inside a decode step of the long one.)
    order = [
        i for i, _, _ in generate_stream(dec, ps, Sampling(12), cpu, slots=2, limits=[12, 2, 2, 2, 2, 2])
    ]
    assert steps == 11, steps
    assert sorted(order) == list(range(6)) and order[-1] == 0, order


def test_with_the_queue_empty_live_rows_move_down_and_only_they_decode() -> None:
    dec, cpu = decoder(), torch.device("cpu")
    ps = prompts(3)
    rows: list[int] = []
    decode = dec.decode

    def counted(tokens, *a, **k):
        rows.append(tokens.shape[0])
        return decode(tokens, *a, **k)

    dec.decode = counted
    got = generate_all(dec, ps, Sampling(12), cpu, slots=3, limits=[2, 2, 12])
    # One step for all three, then the long one alone (moved to row 0).
    assert rows == [3] + [1] * 10, rows
    dec.decode = decode
    assert got == [
        generate_all(dec, [p], Sampling(12), cpu, slots=1, limits=[k])[0]
        for p, k in zip(ps, [2, 2, 12], strict=True)
    ]
