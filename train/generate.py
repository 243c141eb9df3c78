"""job=generate: batch inference, JSONL prompts -> JSONL completions.

Layout: replicas of tp ranks each (``parallelism.tp``; the planner picks the
smallest tp whose shard of the model and KV cache fits a GPU). A replica's
ranks hold the model under the training TP plan (train/parallelize.py's
``apply_tp``: KV cache sharded by heads) and decode the same prompts in
lockstep; replicas and Slurm array tasks take every G-th prompt,
G = array tasks x replicas, and never talk to each other.

Decoding: continuous batching. ``job.batch_size`` sequences are in flight
per replica, one KV cache row ("slot") each, preallocated; when one ends (an
EOS id or ``job.max_new_tokens``) its slot is refilled from the queue at
once, prompts prefilled together (right padding, only the last position's
logits). Fused q/k/v and gate/up projections; greedy or temperature + top-p
sampling.

Resumable: each replica's first rank appends every completion as it ends to
its own part file (``<output>.parts/task<T>-rank<R>.jsonl``), one fsync'd
line at a time, each line carrying the prompt's index. On a restart it drops
a torn last line of its file, every rank reads every part file and skips the
indices already there, so a kill at any moment loses at most the sequences in
flight and never writes a prompt twice. Whichever writer finds every index
present writes ``<output>`` (sorted by index: input order, atomically).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from launcher.config.datasets import read_prompts
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from train.dist import DistInfo
from train.runlog import RunLog
from train.signals import REQUEUE_EXIT_CODE, PreemptFlag

# ---------------------------------------------------------------- prompts / files


def output_path(spec: RunSpec) -> Path:
    return Path(spec.cfg.job.output or os.path.join(spec.run_dir, "completions.jsonl"))


def parts_dir(out: Path) -> Path:
    return out.with_name(out.name + ".parts")


def complete_lines(path: Path) -> list[dict]:
    """The whole lines of a part file (a torn last line is not one)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    end = data.rfind(b"\n")
    return [json.loads(line) for line in data[: end + 1].splitlines() if line.strip()]


def drop_torn_tail(path: Path) -> None:
    """Cut a line the previous attempt was killed in the middle of writing."""
    if not path.exists():
        return
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with open(path, "r+b") as f:
            f.truncate(end)


def done_indices(parts: Path) -> set[int]:
    done: set[int] = set()
    for p in sorted(parts.glob("*.jsonl")):
        done.update(int(r["index"]) for r in complete_lines(p))
    return done


def merge_if_complete(parts: Path, out: Path, n_prompts: int) -> bool:
    """Write ``out`` (every index once, in order) when all are done. Any
    number of ranks may race here: each writes the same bytes, atomically."""
    by_index: dict[int, dict] = {}
    for p in sorted(parts.glob("*.jsonl")):
        for r in complete_lines(p):
            by_index.setdefault(int(r["index"]), r)
    if len(by_index) < n_prompts:
        return False
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        for i in range(n_prompts):
            f.write(json.dumps(by_index[i]) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    return True


# ---------------------------------------------------------------- decoding


def _local(p: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (possibly tensor-parallel DTensor) parameter."""
    from torch.distributed.tensor import DTensor

    return (p.to_local() if isinstance(p, DTensor) else p).detach()


class KVDecoder(nn.Module):
    """Inference view of meshrun's Llama: same weights (q/k/v and gate/up
    fused), a KV cache with one row ("slot") per sequence in flight.

    Under tensor parallelism (``tp_group``) the weights are the shards
    train/parallelize.py's ``apply_tp`` gives this rank (the training plan:
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
        # One fused op; fp32 stats like train/model.py's RMSNorm.
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
        # (train/model.py's apply_rope layout).
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
        n, t = tokens.shape
        nq, nkv, hd = self.nq, self.nkv, self.head_dim
        x = self._embed(tokens)
        rot = rope[:t].view(1, t, 1, -1)
        for layer, (kc, vc) in zip(self.layers, cache, strict=True):
            qkv = F.linear(self._rms(x, layer["n1"]), layer["qkv"]).view(n, t, nq + 2 * nkv, hd)
            qk = self._rope(qkv, rot)
            k, v = qk[:, :, nq:].transpose(1, 2), qkv[:, :, nq + nkv :].transpose(1, 2)
            kc[slots, :, :t] = k
            vc[slots, :, :t] = v
            o = F.scaled_dot_product_attention(
                qk[:, :, :nq].transpose(1, 2), k, v, is_causal=True, enable_gqa=nq > nkv
            )
            x = x + self._sum(F.linear(o.transpose(1, 2).reshape(n, t, nq * hd), layer["wo"]))
            x = self._mlp(x, layer)
        return self._logits(x[torch.arange(n, device=x.device), lens - 1])

    def decode(
        self,
        tokens: torch.Tensor,  # [h] the last token of cache rows 0..h-1
        pos: torch.Tensor,  # [h] its position (= the cache column it goes to)
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        end: int,  # columns to attend over: max(pos) + 1
        rope: torch.Tensor,
    ) -> torch.Tensor:
        """One token for each of the first h cache rows; logits [h, vocab]."""
        h = tokens.shape[0]
        nq, nkv, hd = self.nq, self.nkv, self.head_dim
        group = nq // nkv
        x = self._embed(tokens.view(h, 1))
        rot = rope[pos].view(h, 1, 1, -1)
        rows = torch.arange(h, device=x.device)
        # Each row attends to its own columns 0..pos; the rest (another
        # sequence's longer past, stale entries) is masked.
        cols = torch.arange(end, device=x.device)
        mask = _additive((cols.view(1, -1) <= pos.view(-1, 1)).view(h, 1, 1, end), x.dtype)
        for layer, (kc, vc) in zip(self.layers, cache, strict=True):
            qkv = F.linear(self._rms(x, layer["n1"]), layer["qkv"]).view(h, 1, nq + 2 * nkv, hd)
            qk = self._rope(qkv, rot)
            kc[rows, :, pos] = qk[:, 0, nq:]
            vc[rows, :, pos] = qkv[:, 0, nq + nkv :]
            # A kv head's query group is a 'sequence' of `group` queries
            # under one mask: no repeated k/v, the fast kernel.
            q = qk[:, 0, :nq].reshape(h, nkv, group, hd)
            o = F.scaled_dot_product_attention(q, kc[:h, :, :end], vc[:h, :, :end], attn_mask=mask)
            x = x + self._sum(F.linear(o.reshape(h, 1, nq * hd), layer["wo"]))
            x = self._mlp(x, layer)
        return self._logits(x[:, 0])


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
    from train.model import rope_cos_sin

    n = len(prompts)
    if n == 0:
        return
    limits = limits or [s.max_new_tokens] * n
    m, hd = dec.m, dec.head_dim
    width = min(slots, n)
    total = max(len(p) + k for p, k in zip(prompts, limits, strict=True))
    cs = rope_cos_sin(hd, total, m.rope_theta, device=device, m=m)
    rope = torch.complex(cs[..., 0], cs[..., 1])  # [total, hd/2]
    cache = [
        (
            torch.zeros(width, dec.nkv, total, hd, device=device, dtype=dec.dtype),
            torch.zeros(width, dec.nkv, total, hd, device=device, dtype=dec.dtype),
        )
        for _ in dec.layers
    ]
    eos = set(s.eos)
    queue = deque(range(n))
    req = [-1] * width  # prompt index per slot (-1: free)
    pos = [0] * width  # position of the slot's last token
    outs: list[list[int]] = [[] for _ in range(width)]
    pos_dev = torch.zeros(width, dtype=torch.long, device=device)
    live_dev = torch.zeros(width, dtype=torch.long, device=device)
    cur = torch.zeros(width, dtype=torch.long, device=device)
    share = dec.tp > 1 and s.temperature > 0

    def agree(tok: torch.Tensor) -> torch.Tensor:
        if share:  # identical logits, but one draw for the whole TP group
            dist.broadcast(tok, group=dec.group, group_src=0)
        return tok

    while True:
        free = [i for i in range(width) if req[i] < 0]
        if free and queue:
            take = [queue.popleft() for _ in range(min(len(free), len(queue)))]
            use = free[: len(take)]
            plen = [len(prompts[r]) for r in take]
            toks = torch.zeros(len(take), max(plen), dtype=torch.long)
            for row, r in enumerate(take):
                toks[row, : plen[row]] = torch.tensor(prompts[r])
            use_dev = torch.tensor(use, device=device)
            plen_dev = torch.tensor(plen, device=device)
            first = agree(pick(dec.prefill(toks.to(device), use_dev, plen_dev, cache, rope), s, gen))
            cur[use_dev] = first
            pos_dev[use_dev] = plen_dev - 1
            live_dev[use_dev] = 1
            for slot, r, k, t in zip(use, take, plen, first.tolist(), strict=True):
                req[slot], pos[slot], outs[slot] = r, k - 1, [t]
        ended = False
        for slot in range(width):
            r = req[slot]
            if r < 0:
                continue
            got = outs[slot]
            if got[-1] in eos:
                result = (r, got[:-1], "eos")
            elif len(got) >= limits[r]:
                result = (r, got, "length")
            else:
                continue
            req[slot], ended = -1, True
            live_dev[slot] = 0
            pos_dev[slot] = 0
            yield result
        if ended and queue:
            continue  # refill before the next step
        if ended:
            _compact(req, pos, outs, cur, pos_dev, live_dev, cache)
        active = [i for i in range(width) if req[i] >= 0]
        if not active:
            return
        if stop is not None and stop():
            return
        hi = active[-1] + 1
        # Free rows below hi decode a throwaway token at column 0.
        pos_dev[:hi] += live_dev[:hi]
        for i in active:
            pos[i] += 1
        end = max(pos[i] for i in active) + 1
        nxt = agree(pick(dec.decode(cur[:hi], pos_dev[:hi], cache, end, rope), s, gen))
        cur[:hi] = nxt
        for i, t in enumerate(nxt.tolist()):
            if req[i] >= 0:
                outs[i].append(t)


def _compact(req, pos, outs, cur, pos_dev, live_dev, cache) -> None:
    """No prompt left to refill with: move the highest live rows into the
    free rows below them, so each decode step covers the live rows only."""
    live = [i for i in range(len(req)) if req[i] >= 0]
    holes = [i for i in range(len(live)) if req[i] < 0]
    srcs = [i for i in reversed(live) if i >= len(live)][: len(holes)]
    if not srcs:
        return
    n = max(pos[i] for i in srcs) + 1
    dst_t = torch.tensor(holes, device=cur.device)
    src_t = torch.tensor(srcs, device=cur.device)
    for kc, vc in cache:
        kc[dst_t, :, :n] = kc[src_t, :, :n]
        vc[dst_t, :, :n] = vc[src_t, :, :n]
    for t in (cur, pos_dev, live_dev):
        t[dst_t] = t[src_t]
    live_dev[src_t] = 0
    pos_dev[src_t] = 0
    for d, src in zip(holes, srcs, strict=True):
        req[d], pos[d], outs[d] = req[src], pos[src], outs[src]
        req[src] = -1


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


# ---------------------------------------------------------------- the job


def eos_ids(spec: RunSpec) -> tuple[int, ...]:
    j = spec.cfg.job
    if j.eos_token_ids:
        return tuple(j.eos_token_ids)
    if j.hf_path and (Path(j.hf_path) / "config.json").is_file():
        e = json.loads((Path(j.hf_path) / "config.json").read_text()).get("eos_token_id")
        if e is not None:
            return tuple(e) if isinstance(e, list) else (int(e),)
    return ()


def build_decoder(spec: RunSpec, device: torch.device, tp_mesh=None) -> tuple[KVDecoder, str]:
    """The model on this rank from the job's weights: whole, or (``tp_mesh``)
    this rank's shard under the training TP plan, read straight into that
    layout (HF safetensors slices or the checkpoint's DCP shards)."""
    from train.hf import load_job_weights
    from train.model import Llama
    from train.parallelize import apply_tp

    with torch.device("meta"):
        model = Llama(spec.cfg.model)
    if tp_mesh is not None:
        apply_tp(model, tp_mesh)
    model.to_empty(device=device)
    source = load_job_weights([model], spec, no_dist=tp_mesh is None)
    if spec.plan.precision == "bf16":
        model.to(torch.bfloat16)
    model.requires_grad_(False)
    return KVDecoder(model, tp_mesh.get_group() if tp_mesh is not None else None), source


def array_task() -> tuple[int, int]:
    """(task index, task count) of a Slurm job array; (0, 1) otherwise."""
    tid = os.environ.get("SLURM_ARRAY_TASK_ID", "")
    count = os.environ.get("SLURM_ARRAY_TASK_COUNT", "")
    if tid and count:
        return int(tid) - int(os.environ.get("SLURM_ARRAY_TASK_MIN", "0") or 0), int(count)
    return 0, 1


def _record(i: int, prompt: dict, ids: list[int], reason: str, tok) -> dict:
    rec = {"index": i}
    if "id" in prompt:
        rec["id"] = prompt["id"]
    rec.update(
        {
            "prompt": prompt["prompt"],
            "completion": tok.decode(ids, skip_special_tokens=True),
            "completion_tokens": ids,
            "finish_reason": reason,
        }
    )
    return rec


def run_generate(spec: RunSpec, info: DistInfo, log: RunLog, flag: PreemptFlag) -> int:
    from tokenizers import Tokenizer

    j = spec.cfg.job
    device = torch.device(info.device)
    task, tasks = array_task()
    if tasks == 1 and j.array_tasks > 1:
        tasks = j.array_tasks  # outside Slurm: task index 0 of the planned count
    tp = spec.plan.tp
    tp_mesh = None
    if tp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        tp_mesh = init_device_mesh(device.type, (info.world_size // tp, tp), mesh_dim_names=("dp", "tp"))[
            "tp"
        ]
    # tp innermost (train/mesh.py's order): ranks r*tp .. r*tp+tp-1 are one
    # replica, decoding the same prompts; its first rank writes.
    replica, replicas, writer = info.rank // tp, info.world_size // tp, info.rank % tp == 0
    shard, n_shards = task * replicas + replica, tasks * replicas
    prompts = read_prompts(j.prompts)
    out = output_path(spec)
    parts = parts_dir(out)
    parts.mkdir(parents=True, exist_ok=True)
    mine_file = parts / f"task{task}-rank{info.rank}.jsonl"
    if writer:
        drop_torn_tail(mine_file)
    # Only this replica's writer adds lines of this shard, and not yet: every
    # rank of the replica reads the same set.
    done = done_indices(parts)
    todo = [i for i in range(shard, len(prompts), n_shards) if i not in done]
    tok = Tokenizer.from_file(j.tokenizer)
    if tok.get_vocab_size() > spec.cfg.model.vocab_size:
        raise ConfigError(
            f"job.tokenizer={j.tokenizer} has {tok.get_vocab_size()} tokens, more than "
            f"model.vocab_size={spec.cfg.model.vocab_size}: not this model's tokenizer"
        )
    encoded = {i: tok.encode(prompts[i]["prompt"]).ids for i in todo}
    # Longest first: similar lengths prefill together, and the long ones do
    # not start last and hold a slot alone at the end.
    todo.sort(key=lambda i: (-len(encoded[i]), i))
    dec, source = build_decoder(spec, device, tp_mesh)
    s = Sampling(j.max_new_tokens, j.temperature, j.top_p, eos_ids(spec))
    gen = torch.Generator(device=device).manual_seed(spec.cfg.train.seed * 1000 + shard)
    log.print(
        f"generate: {len(prompts)} prompts, {len(done)} already done; {n_shards} shards "
        f"({tasks} array task(s) x {replicas} replica(s) of tp={tp}); {j.batch_size} sequences "
        f"in flight per replica (continuous batching); weights: {source}"
    )

    def stop() -> bool:
        if tp == 1:
            return flag.is_set()
        # Every rank of the replica stops at the same step, or one would
        # wait forever in the next step's all-reduce.
        t = torch.tensor([int(flag.is_set())], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=dec.group)
        return bool(t.item())

    t0, new_tokens, written = time.perf_counter(), 0, 0
    stream = generate_stream(dec, [encoded[i] for i in todo], s, device, gen, j.batch_size, stop=stop)
    with open(mine_file, "a") if writer else contextlib.nullcontext() as f:
        for k, ids, reason in stream:
            i = todo[k]
            if f is not None:
                # Whole lines, flushed and fsync'd one by one: a kill loses
                # only the sequences still in flight.
                f.write(json.dumps(_record(i, prompts[i], ids, reason, tok)) + "\n")
                f.flush()
                os.fsync(f.fileno())
            new_tokens += len(ids)
            written += 1
            if written % max(1, j.batch_size) == 0 or written == len(todo):
                log.print(f"generate: replica {replica}: {written}/{len(todo)} of its prompts")
    dt = time.perf_counter() - t0
    if written < len(todo):
        log.result(written, None, "preempted", completions=written)
        log.print("generate: preempted; a requeue resumes with the prompts not written yet")
        return REQUEUE_EXIT_CODE
    merged = writer and merge_if_complete(parts, out, len(prompts))
    rate = new_tokens / dt if dt > 0 else 0.0
    log.print(
        f"generate: replica {replica} wrote {written} completions, {new_tokens} tokens, {rate:,.0f} tokens/s"
        + (f"; all {len(prompts)} in {out}" if merged else "")
    )
    log.result(written, None, "completed", completions=written, tokens_per_s=rate, output=str(out))
    return 0
