"""Ring attention's communication under context parallel (parallelism.cp).

Each of the cp ranks holds seq_len / cp tokens of a sequence. Per attention
layer and micro-batch, torch's ring (``_templated_ring_attention``,
torch.distributed.tensor.experimental) passes every rank's K and V block
to the next rank cp - 1 times in forward; backward passes K and V around
again and their gradients (fp32 accumulators: ``convert_to_f32``) too, cp - 1
times each; full activation checkpointing reruns the forward's passes.
Bytes per pass: 2 (K, V) x local tokens x heads x head_dim / tp x the
compute precision's bytes: meshrun's attention expands grouped KV heads
before SDPA (train/models/llama.py), so n_heads, not n_kv_heads, are sent.

Overlap (Liu, Zaharia, Abbeel 2023, "Ring Attention with Blockwise
Transformers", arXiv:2310.01889, section 3; torch sends block i + 1 while it
computes on block i): on GPUs only the part longer than the step's
attention compute is exposed; on CPU ranks nothing hides (as for every gloo
collective in launcher/perf/steptime.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.perf import comm

GRAD_BYTES = 4  # dK, dV accumulated and passed in fp32


@dataclass(frozen=True)
class RingCost:
    kv_bytes: float  # one K + V block, per pass
    passes: float  # per step (K/V and gradient passes)
    total_s: float  # all passes, hidden or not
    exposed_s: float  # on the critical path
    link: str


def ring_passes(cp: int, ac: str) -> tuple[int, int]:
    """(K/V passes, gradient passes) per attention layer and micro-batch."""
    if cp <= 1:
        return 0, 0
    fwd = (cp - 1) * (2 if ac == "full" else 1)  # full AC reruns the forward
    return fwd + (cp - 1), cp - 1


def ring_attention(m: Any, cp: int, sh: Any, link: comm.Link, attention_s: float) -> RingCost:
    """The step's ring traffic for ``sh`` (launcher/perf/steptime.py's shape of
    the slowest rank: its local tokens per micro-batch, layers, micro-batches)
    and its attention compute ``attention_s`` per step."""
    if cp <= 1:
        return RingCost(0.0, 0.0, 0.0, 0.0, link.name)
    elems = 2 * sh.tokens_mb * m.n_heads * sh.hd / sh.tp
    kv, grads = ring_passes(cp, sh.ac)
    per_layer = kv * comm.p2p(elems * sh.act_bytes, link) + grads * comm.p2p(elems * GRAD_BYTES, link)
    total = sh.layers * sh.n_mb * per_layer
    exposed = total if sh.cpu else max(0.0, total - attention_s)
    return RingCost(elems * sh.act_bytes, sh.layers * sh.n_mb * (kv + grads), total, exposed, link.name)
