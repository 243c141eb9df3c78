"""Llama-style decoder: RMSNorm, RoPE, grouped-query attention through
scaled_dot_product_attention, SwiGLU. Built on the meta device and
materialized after sharding; weights are a pure function of (seed, parameter
name), so every layout starts from the same numbers as one process does.

Layers live in a ModuleDict keyed "0".."n-1" so that pipeline stages can
drop layers and keep the original names (checkpoints stay layout-free), and
the embedding / norm / output may be None on middle stages.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from launcher.config.schema import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32 for stability under bf16 params.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.type_as(x) * self.weight


def rope_cos_sin(
    head_dim: int, seq_len: int, theta: float, device=None, m: ModelConfig | None = None
) -> torch.Tensor:
    """[seq, head_dim/2, 2] (cos, sin); real-valued so DTensor/compile/gloo all
    handle it. ``m`` with rope_scaling_factor > 0: Llama 3.1's frequency
    scaling (as transformers' "llama3" rope type)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if m is not None and m.rope_scaling_factor > 0:
        freqs = _llama3_scaled(freqs, m)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), freqs)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def _llama3_scaled(freqs: torch.Tensor, m: ModelConfig) -> torch.Tensor:
    # Long wavelengths slowed by the factor, short ones kept, a smooth ramp between.
    factor, low, high = m.rope_scaling_factor, m.rope_low_freq_factor, m.rope_high_freq_factor
    old = m.rope_original_max_positions
    wavelen = 2 * math.pi / freqs
    scaled = torch.where(wavelen > old / low, freqs / factor, freqs)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    # x: [batch, seq, heads, head_dim]; rotate (even, odd) pairs.
    xf = x.float().unflatten(-1, (-1, 2))
    cos = rope[: x.shape[1], :, 0].view(1, x.shape[1], 1, -1)
    sin = rope[: x.shape[1], :, 1].view(1, x.shape[1], 1, -1)
    a, b = xf[..., 0], xf[..., 1]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.head_dim = m.dim // m.n_heads
        self.kv_repeat = m.n_heads // m.n_kv_heads
        self.wq = nn.Linear(m.dim, m.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(m.dim, m.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(m.dim, m.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(m.n_heads * self.head_dim, m.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        # -1 heads: under tensor parallel each rank holds n_heads / tp of them.
        q = self.wq(x).view(bs, seq, -1, self.head_dim)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        k = k.repeat_interleave(self.kv_repeat, dim=2)
        v = v.repeat_interleave(self.kv_repeat, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(m.dim, m.ffn_dim, bias=False)
        self.w2 = nn.Linear(m.ffn_dim, m.dim, bias=False)
        self.w3 = nn.Linear(m.dim, m.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(m.dim, m.norm_eps)
        self.attention = Attention(m)
        self.ffn_norm = RMSNorm(m.dim, m.norm_eps)
        self.feed_forward = FeedForward(m)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        if m.family != "llama":
            raise ValueError(f"model.family={m.family!r} is invalid: the trainer builds family=llama models")
        self.cfg = m
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(m.vocab_size, m.dim)
        self.layers = nn.ModuleDict({str(i): Block(m) for i in range(m.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(m.dim, m.norm_eps)
        self.output: nn.Linear | None = nn.Linear(m.dim, m.vocab_size, bias=False)
        # Not persistent: recomputed on materialization, never checkpointed.
        self.register_buffer(
            "rope", rope_cos_sin(m.dim // m.n_heads, m.seq_len, m.rope_theta, m=m), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # First stage gets token ids; later pipeline stages get hidden states.
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h).float() if self.output is not None else h


def build_meta_model(m: ModelConfig) -> Llama:
    if m.family == "vit":
        from train.models.vit import build_meta_vit  # owner: data

        return build_meta_vit(m)
    with torch.device("meta"):
        return Llama(m)


def _param_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def _init_full(name: str, shape: torch.Size, m: ModelConfig, seed: int, device: torch.device) -> torch.Tensor:
    """The full (unsharded) initial value of one parameter."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, device=device)
    if name.endswith("bias"):  # ViT only; the Llama has none
        return torch.zeros(shape, device=device)
    gen = torch.Generator(device=device).manual_seed(_param_seed(seed, name))
    if "tok_embeddings" in name:
        std = 1.0
    elif name.endswith(("wo.weight", "w2.weight")):
        # Output projections scaled by depth (GPT-2 / torchtitan style).
        std = 0.02 / math.sqrt(2 * m.n_layers)
    elif name.startswith("output"):
        std = m.dim**-0.5
    else:
        std = 0.02
    full = torch.empty(shape, device=device)
    return full.normal_(0.0, std, generator=gen).clamp_(-3 * std, 3 * std)


@torch.no_grad()
def materialize_and_init(model: nn.Module, m: ModelConfig, seed: int, device: torch.device) -> None:
    """Allocate a (possibly sharded) meta model on ``device`` and fill every
    parameter with its seed-determined value. Each rank generates a
    parameter's full value one at a time and keeps its own shard; DTensor
    Replicate -> Shard redistribution is a local slice, no communication."""
    from torch.distributed.tensor import DTensor, Replicate

    model.to_empty(device=device)
    for name, p in model.named_parameters():
        name = _canonical_name(name)
        if isinstance(p, DTensor):
            full = _init_full(name, p.shape, m, seed, device).to(p.dtype)
            rep = DTensor.from_local(full, p.device_mesh, [Replicate()] * p.device_mesh.ndim, run_check=False)
            p.to_local().copy_(rep.redistribute(p.device_mesh, p.placements).to_local())
        else:
            p.copy_(_init_full(name, p.shape, m, seed, device))
    for mod in model.modules():
        if isinstance(mod, Llama):
            mod.rope = rope_cos_sin(m.dim // m.n_heads, m.seq_len, m.rope_theta, device=device, m=m)


def _canonical_name(name: str) -> str:
    # Wrappers (activation checkpointing, torch.compile) insert path parts
    # that must not change a parameter's seed.
    for part in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(part, "")
    return name
