"""A small Vision Transformer (ViT) for data=images.

Same outer shape as the Llama in train/models/llama.py so the trainer's meta-device
build, seed-by-name init, FSDP2 wrapping and loss apply unchanged: blocks in
``layers`` (a ModuleDict), a final ``norm`` and an ``output`` head;
``tok_embeddings`` is None (the patch embedding is sharded with the root).
Logits are [batch, 1, classes] and the image loader's targets [batch, 1]:
one classification "position" per sample, so the language-model loss
(flatten batch x positions) needs no special case.

Parameters match launcher.perf.flops.param_counts(family="vit") exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from launcher.config.schema import ModelConfig


class PatchEmbed(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.patch_size = m.patch_size
        n_patches = (m.image_size // m.patch_size) ** 2
        # No bias: the position embedding added to every patch absorbs it.
        self.proj = nn.Linear(3 * m.patch_size**2, m.dim, bias=False)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, m.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, n_patches + 1, m.dim))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # [B, 3, H, W] -> [B, patches, 3 * p * p]: a strided conv as a matmul.
        p = self.patch_size
        patches = F.unfold(images.to(self.proj.weight.dtype), kernel_size=p, stride=p).transpose(1, 2)
        h = self.proj(patches)
        cls = self.cls_token.expand(h.shape[0], -1, -1).to(h.dtype)
        return torch.cat([cls, h], dim=1) + self.pos_embed.to(h.dtype)


class Attention(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.head_dim = m.dim // m.n_heads
        self.wqkv = nn.Linear(m.dim, 3 * m.dim)
        self.wo = nn.Linear(m.dim, m.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        q, k, v = self.wqkv(x).view(bs, seq, 3, -1, self.head_dim).unbind(2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(m.dim, m.ffn_dim)
        self.w2 = nn.Linear(m.ffn_dim, m.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(m.dim, eps=m.norm_eps)
        self.attention = Attention(m)
        self.ffn_norm = nn.LayerNorm(m.dim, eps=m.norm_eps)
        self.feed_forward = FeedForward(m)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class ViT(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        if m.family != "vit":
            raise ValueError(f"model.family={m.family!r} is invalid: ViT builds family=vit models")
        self.cfg = m
        self.tok_embeddings = None
        self.patch_embed = PatchEmbed(m)
        self.layers = nn.ModuleDict({str(i): Block(m) for i in range(m.n_layers)})
        self.norm = nn.LayerNorm(m.dim, eps=m.norm_eps)
        self.output = nn.Linear(m.dim, m.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        h = self.patch_embed(images)
        for layer in self.layers.values():
            h = layer(h)
        # Classify from the CLS position; keep a length-1 position axis. A
        # copy, not a view: FSDP2's backward hook must not sit on a view.
        return self.output(self.norm(h[:, 0])).float()[:, None].clone()


def build_meta_vit(m: ModelConfig) -> ViT:
    with torch.device("meta"):
        return ViT(m)
