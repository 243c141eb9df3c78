"""Decoding for job=generate (:mod:`train.jobs.generate`): an inference view of
meshrun's Llama with a preallocated KV cache (:class:`KVDecoder`), greedy or
temperature + top-p sampling, and continuous batching
(:func:`generate_stream`): when a sequence ends its slot is refilled from
the queue at once, the admitted prompts prefilled together (right padding,
only the last position's logits) in the same pass over the weights as the
next decode step of the sequences in flight.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _local(p: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (possibly tensor-parallel DTensor) parameter."""
    from torch.distributed.tensor import DTensor

    return (p.to_local() if isinstance(p, DTensor) else p).detach()


class KVDecoder(nn.Module):
    """Inference view of meshrun's Llama: same weights (q/k/v and gate/up
    fused), a KV cache with one row ("slot") per sequence in flight.

    Under tensor parallelism (``tp_group``) the weights are the shards
    train/parallel/parallelize.py's ``apply_tp`` gives this rank (the training plan:
    vocab-sharded embedding and output, column-parallel q/k/v and gate/up,
    row-parallel o and down projections): each rank holds n_heads / tp query
    and n_kv_heads / tp key/value heads, so the KV cache is sharded by heads;
    an all-reduce after each row-parallel projection and an all-gather of the
    logits. Decoding runs on whole sequences (no sequence parallel: one new
    token per step cannot be split).
    """

    def __init__(self, model: nn.Module, tp_group=None) -> None:
        super().__init__()
        m = model.cfg
        self.m = m
        self.group = tp_group
        self.tp = dist.get_world_size(tp_group) if tp_group is not None else 1
        self.head_dim = m.dim // m.n_heads
        self.nq, self.nkv = m.n_heads // self.tp, m.n_kv_heads // self.tp
        self.emb = _local(model.tok_embeddings.weight)
        self.vocab_start = (dist.get_rank(tp_group) if self.tp > 1 else 0) * self.emb.shape[0]
        self.layers = []
        for blk in model.layers.values():
            a, ff = blk.attention, blk.feed_forward
            self.layers.append(
                {
                    "n1": _local(blk.attention_norm.weight),
                    "qkv": torch.cat(
                        [_local(a.wq.weight), _local(a.wk.weight), _local(a.wv.weight)]
                    ).contiguous(),
                    "wo": _local(a.wo.weight),
                    "n2": _local(blk.ffn_norm.weight),
                    "w13": torch.cat([_local(ff.w1.weight), _local(ff.w3.weight)]).contiguous(),
                    "w2": _local(ff.w2.weight),
                }
            )
        self.norm = _local(model.norm.weight)
        self.out = _local(model.output.weight)
        self.eps = m.norm_eps

    @property
    def dtype(self) -> torch.dtype:
        return self.emb.dtype

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # One fused op; fp32 stats like train/models/llama.py's RMSNorm.
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * w

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        """Row-parallel partial sums -> the full value on every TP rank."""
        if self.tp > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            return F.embedding(tokens, self.emb)
        rows = self.emb.shape[0]
        local = tokens - self.vocab_start
        inside = (local >= 0) & (local < rows)
        x = F.embedding(local.clamp(0, rows - 1), self.emb) * inside.unsqueeze(-1).to(self.emb.dtype)
        return self._sum(x)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        y = F.linear(self._rms(h, self.norm), self.out).float()
        if self.tp == 1:
            return y
        parts = [torch.empty_like(y) for _ in range(self.tp)]
        dist.all_gather(parts, y.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def _rope(self, qkv: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        # RoPE on q and k at once; interleaved pairs are complex numbers
        # (train/models/llama.py's apply_rope layout).
        b, t, nq, nkv = qkv.shape[0], qkv.shape[1], self.nq, self.nkv
        qk = qkv[:, :, : nq + nkv].float().reshape(b, t, nq + nkv, self.head_dim // 2, 2)
        return torch.view_as_real(torch.view_as_complex(qk) * rot).flatten(3).type_as(qkv)

    def _mlp(self, x: torch.Tensor, layer: dict) -> torch.Tensor:
        g, u = F.linear(self._rms(x, layer["n2"]), layer["w13"]).chunk(2, dim=-1)
        return x + self._sum(F.linear(F.silu(g) * u, layer["w2"]))

    def prefill(
        self,
        tokens: torch.Tensor,  # [n, L] right-padded prompts
        slots: torch.Tensor,  # [n] cache rows they take
        lens: torch.Tensor,  # [n] prompt lengths
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        rope: torch.Tensor,  # [positions, hd/2] complex
    ) -> torch.Tensor:
        """Prompts into their cache rows (positions 0..L-1); logits [n, vocab]
        of each prompt's last token. Right padding under a causal mask: a
        real token never sees a pad, and a pad's cache entries lie past the
        prompt, where decode overwrites them before attending to them."""
        return self._pass(None, (tokens, slots, lens), cache, rope)

    def decode(
        self,
        tokens: torch.Tensor,  # [h] the last token of cache rows 0..h-1
        pos: torch.Tensor,  # [h] its position (= the cache column it goes to)
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        end: int,  # columns to attend over: max(pos) + 1
        rope: torch.Tensor,
        admit: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """One token for each of the first h cache rows; logits [h, vocab].

        ``admit`` (tokens, slots, lens as for :meth:`prefill`): new prompts
        prefilled in the same pass over the weights (one read of every
        matrix, the output head included, instead of two), into free rows
        among the first h; those rows' logits are of their prompt's last
        token."""
        return self._pass((tokens, pos, end), admit, cache, rope)

    def _pass(self, step, admit, cache, rope) -> torch.Tensor:
        """Decode rows (``step``) and prefill prompts (``admit``) as one
        token batch through every matrix; attention apart."""
        ids, h, n = [], 0, 0
        if step is not None:
            tok, pos, end = step
            h = tok.shape[0]
            ids.append(tok.view(h))
            # Each row attends to its own columns 0..pos; the rest (another
            # sequence's longer past, stale entries) is masked.
            cols = torch.arange(end, device=tok.device)
            mask = _additive((cols.view(1, -1) <= pos.view(-1, 1)).view(h, 1, 1, end), self.dtype)
            d = (torch.arange(h, device=tok.device), pos, end, mask, rope[pos].view(h, 1, 1, -1))
        if admit is not None:
            ptok, slots, lens = admit
            n, t = ptok.shape
            ids.append(ptok.reshape(n * t))
            rot = rope[:t].view(1, t, 1, -1)
        x = self._embed(torch.cat(ids) if len(ids) > 1 else ids[0])
        width = self.nq + 2 * self.nkv
        for layer, (kc, vc) in zip(self.layers, cache, strict=True):
            qkv = F.linear(self._rms(x, layer["n1"]), layer["qkv"])
            o = []
            if h:  # first: its stray writes into admitted rows are overwritten below
                o.append(self._attend_step(qkv[:h].view(h, 1, width, -1), kc, vc, *d))
            if n:
                o.append(self._attend_new(qkv[h:].view(n, t, width, -1), kc, vc, slots, rot))
            x = x + self._sum(F.linear(torch.cat(o) if len(o) > 1 else o[0], layer["wo"]))
            x = self._mlp(x, layer)
        if not n:
            return self._logits(x)
        last = x[h:].view(n, t, -1)[torch.arange(n, device=x.device), lens - 1]
        return self._logits(x[:h].index_copy(0, slots, last) if h else last)

    def _attend_step(self, qkv, kc, vc, rows, pos, end, mask, rot) -> torch.Tensor:
        h, nq, nkv = qkv.shape[0], self.nq, self.nkv
        qk = self._rope(qkv, rot)
        kc[rows, :, pos] = qk[:, 0, nq:]
        vc[rows, :, pos] = qkv[:, 0, nq + nkv :]
        # A kv head's query group is a 'sequence' of nq / nkv queries under
        # one mask: no repeated k/v, the fast kernel.
        q = qk[:, 0, :nq].reshape(h, nkv, nq // nkv, self.head_dim)
        o = F.scaled_dot_product_attention(q, kc[:h, :, :end], vc[:h, :, :end], attn_mask=mask)
        return o.reshape(h, nq * self.head_dim)

    def _attend_new(self, qkv, kc, vc, slots, rot) -> torch.Tensor:
        n, t, nq, nkv = qkv.shape[0], qkv.shape[1], self.nq, self.nkv
        qk = self._rope(qkv, rot)
        k, v = qk[:, :, nq:].transpose(1, 2), qkv[:, :, nq + nkv :].transpose(1, 2)
        kc[slots, :, :t] = k
        vc[slots, :, :t] = v
        o = F.scaled_dot_product_attention(
            qk[:, :, :nq].transpose(1, 2), k, v, is_causal=True, enable_gqa=nq > nkv
        )
        return o.transpose(1, 2).reshape(n * t, nq * self.head_dim)


@dataclass
class Sampling:
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    eos: tuple[int, ...] = ()


def pick(logits: torch.Tensor, s: Sampling, gen: torch.Generator | None) -> torch.Tensor:
    if s.temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / s.temperature, dim=-1)
    if s.top_p < 1.0:
        sp, idx = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (always >= 1 token).
        sp[(sp.cumsum(-1) - sp) >= s.top_p] = 0.0
        choice = torch.multinomial(sp, 1, generator=gen)
        return idx.gather(-1, choice).squeeze(-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.tensor(float("-inf"), dtype=dtype, device=allowed.device))


@torch.inference_mode()
def generate_stream(
    dec: KVDecoder,
    prompts: list[list[int]],
    s: Sampling,
    device: torch.device,
    gen: torch.Generator | None = None,
    slots: int = 8,
    limits: list[int] | None = None,
    stop: Callable[[], bool] | None = None,
) -> Iterator[tuple[int, list[int], str]]:
    """Continuous batching: ``slots`` sequences decode together; the moment
    one ends (an EOS id, or its limit: ``limits[i]`` or s.max_new_tokens),
    its slot is yielded as (index into prompts, new tokens without the EOS,
    "eos" | "length") and refilled from the queue, prompts taken in list
    order. ``stop()`` (checked once per step) ends the stream early: the
    sequences in flight are dropped, never yielded half done.

    Under tensor parallelism every rank of the TP group calls this with the
    same arguments and decides the same things (the logits are all-gathered;
    sampled tokens are broadcast from the group's first rank)."""
    n = len(prompts)
    if n == 0:
        return
    b = _Batch(dec, prompts, s, device, gen, min(slots, n), limits or [s.max_new_tokens] * n)
    while True:
        ended = False
        for result in b.finished():
            ended = True
            yield result
        if ended and not b.queue:
            b.compact()
        active = [i for i in range(b.width) if b.req[i] >= 0]
        if not (active or b.queue):
            return
        if stop is not None and stop():
            return
        b.step(active)


class _Batch:
    """The slots of :func:`generate_stream`: one KV cache row each, the
    prompt each decodes, its position and the tokens it made so far."""

    def __init__(
        self,
        dec: KVDecoder,
        prompts: list[list[int]],
        s: Sampling,
        device: torch.device,
        gen: torch.Generator | None,
        width: int,
        limits: list[int],
    ) -> None:
        from train.models.llama import rope_cos_sin

        self.dec, self.prompts, self.s, self.device, self.gen = dec, prompts, s, device, gen
        self.width, self.limits = width, limits
        m, hd = dec.m, dec.head_dim
        total = max(len(p) + k for p, k in zip(prompts, limits, strict=True))
        cs = rope_cos_sin(hd, total, m.rope_theta, device=device, m=m)
        self.rope = torch.complex(cs[..., 0], cs[..., 1])  # [total, hd/2]
        self.cache = [
            (
                torch.zeros(width, dec.nkv, total, hd, device=device, dtype=dec.dtype),
                torch.zeros(width, dec.nkv, total, hd, device=device, dtype=dec.dtype),
            )
            for _ in dec.layers
        ]
        self.eos = set(s.eos)
        self.queue = deque(range(len(prompts)))
        self.req = [-1] * width  # prompt index per slot (-1: free)
        self.pos = [0] * width  # position of the slot's last token
        self.outs: list[list[int]] = [[] for _ in range(width)]
        self.pos_dev = torch.zeros(width, dtype=torch.long, device=device)
        self.live_dev = torch.zeros(width, dtype=torch.long, device=device)
        self.cur = torch.zeros(width, dtype=torch.long, device=device)
        self.share = dec.tp > 1 and s.temperature > 0

    def agree(self, tok: torch.Tensor) -> torch.Tensor:
        if self.share:  # identical logits, but one draw for the whole TP group
            dist.broadcast(tok, group=self.dec.group, group_src=0)
        return tok

    def admit(self) -> tuple[list[int], list[int], tuple | None]:
        """Free slots take the next prompts: (slots, prompt indexes, the
        prefill batch for :meth:`KVDecoder.decode`'s ``admit``)."""
        free = [i for i in range(self.width) if self.req[i] < 0]
        take = [self.queue.popleft() for _ in range(min(len(free), len(self.queue)))]
        if not take:
            return [], [], None
        use, plen = free[: len(take)], [len(self.prompts[r]) for r in take]
        toks = torch.zeros(len(take), max(plen), dtype=torch.long)
        for row, r in enumerate(take):
            toks[row, : plen[row]] = torch.tensor(self.prompts[r])
        dev = self.device
        return use, take, (toks.to(dev), torch.tensor(use, device=dev), torch.tensor(plen, device=dev))

    def finished(self) -> Iterator[tuple[int, list[int], str]]:
        """The sequences that ended (EOS or their limit); their slots freed."""
        for slot in range(self.width):
            r = self.req[slot]
            if r < 0:
                continue
            got = self.outs[slot]
            if got[-1] in self.eos:
                result = (r, got[:-1], "eos")
            elif len(got) >= self.limits[r]:
                result = (r, got, "length")
            else:
                continue
            self.req[slot] = -1
            self.live_dev[slot] = 0
            self.pos_dev[slot] = 0
            yield result

    def compact(self) -> None:
        """No prompt left to refill with: move the highest live rows into the
        free rows below them, so each decode step covers the live rows only."""
        req, pos, outs = self.req, self.pos, self.outs
        cur, pos_dev, live_dev = self.cur, self.pos_dev, self.live_dev
        live = [i for i in range(len(req)) if req[i] >= 0]
        holes = [i for i in range(len(live)) if req[i] < 0]
        srcs = [i for i in reversed(live) if i >= len(live)][: len(holes)]
        if not srcs:
            return
        n = max(pos[i] for i in srcs) + 1
        dst_t = torch.tensor(holes, device=cur.device)
        src_t = torch.tensor(srcs, device=cur.device)
        for kc, vc in self.cache:
            kc[dst_t, :, :n] = kc[src_t, :, :n]
            vc[dst_t, :, :n] = vc[src_t, :, :n]
        for t in (cur, pos_dev, live_dev):
            t[dst_t] = t[src_t]
        live_dev[src_t] = 0
        pos_dev[src_t] = 0
        for d, src in zip(holes, srcs, strict=True):
            req[d], pos[d], outs[d] = req[src], pos[src], outs[src]
            req[src] = -1

    def step(self, active: list[int]) -> None:
        """One decode step of every active slot; the next prompts admitted
        into the free slots in the same pass (each gets its first token)."""
        use, take, new = self.admit()
        if not active:  # nothing to decode: a plain prefill
            nxt = self.agree(pick(self.dec.prefill(*new, self.cache, self.rope), self.s, self.gen))
            self.cur[new[1]] = nxt
        else:
            hi = max(active[-1], use[-1] if use else -1) + 1
            # Free rows below hi decode a throwaway token at column 0 (an
            # admitted row's prompt overwrites it in the same pass).
            self.pos_dev[:hi] += self.live_dev[:hi]
            for i in active:
                self.pos[i] += 1
            end = max(self.pos[i] for i in active) + 1
            logits = self.dec.decode(self.cur[:hi], self.pos_dev[:hi], self.cache, end, self.rope, new)
            nxt = self.agree(pick(logits, self.s, self.gen))
            self.cur[:hi] = nxt
            toks = nxt.tolist()
            for i in active:
                self.outs[i].append(toks[i])
            nxt = nxt[new[1]] if new is not None else nxt[:0]
        if new is not None:
            self.pos_dev[new[1]] = new[2] - 1
            self.live_dev[new[1]] = 1
            for slot, r, t in zip(use, take, nxt.tolist(), strict=True):
                self.req[slot], self.pos[slot], self.outs[slot] = r, len(self.prompts[r]) - 1, [t]


def generate_all(
    dec: KVDecoder,
    prompts: list[list[int]],
    s: Sampling,
    device: torch.device,
    gen: torch.Generator | None = None,
    slots: int = 8,
    limits: list[int] | None = None,
) -> list[tuple[list[int], str]]:
    """(new tokens without the EOS, finish reason) per prompt, in order."""
    res: list[tuple[list[int], str]] = [([], "")] * len(prompts)
    for i, ids, reason in generate_stream(dec, prompts, s, device, gen, slots, limits):
        res[i] = (ids, reason)
    return res
