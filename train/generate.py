"""job=generate: batch inference, JSONL prompts -> JSONL completions.

Each rank holds one whole copy of the model (data parallel: generation has
no gradients to share) and takes every G-th prompt, G = array tasks x ranks,
so ranks and Slurm array tasks split the file without talking to each other.

Decoding: left-padded batches sorted by prompt length, a preallocated
key/value cache per layer, prefill in one forward (only the last position's
logits), then one token per step; fused q/k/v and gate/up projections; greedy
or temperature + top-p sampling; a sequence stops at an EOS id or after
``job.max_new_tokens``.

Resumable: each rank appends its completions to its own part file
(``<output>.parts/task<T>-rank<R>.jsonl``), one fsync'd batch at a time, each
line carrying the prompt's index. On a restart a rank drops a torn last line
of its file, reads every part file, and skips the indices already there, so a
kill at any moment loses at most the batch in flight and never writes a
prompt twice. Whichever rank finds every index present writes ``<output>``
(sorted by index, atomically).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
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


class KVDecoder(nn.Module):
    """Inference view of meshrun's Llama: same weights (q/k/v and gate/up
    fused), a static KV cache and per-sequence positions for left padding."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        m = model.cfg
        self.m = m
        self.head_dim = m.dim // m.n_heads
        self.emb = model.tok_embeddings.weight
        self.layers = []
        for blk in model.layers.values():
            a, ff = blk.attention, blk.feed_forward
            self.layers.append(
                {
                    "n1": blk.attention_norm.weight,
                    "qkv": torch.cat([a.wq.weight, a.wk.weight, a.wv.weight]).contiguous(),
                    "wo": a.wo.weight,
                    "n2": blk.ffn_norm.weight,
                    "w13": torch.cat([ff.w1.weight, ff.w3.weight]).contiguous(),
                    "w2": ff.w2.weight,
                }
            )
        self.norm = model.norm.weight
        self.out = model.output.weight
        self.eps = m.norm_eps

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # One fused op; fp32 stats like train/model.py's RMSNorm.
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * w

    def forward(
        self,
        tokens: torch.Tensor,  # [B, T]
        rot: torch.Tensor,  # [B, T, 1, hd/2] complex rotations of the tokens' positions
        start: int,  # cache slot of tokens[:, 0]
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,  # [B, 1, T, start + T] additive (0 / -inf)
    ) -> torch.Tensor:
        m, hd = self.m, self.head_dim
        bs, t = tokens.shape
        nq, nkv = m.n_heads, m.n_kv_heads
        group = nq // nkv
        x = F.embedding(tokens, self.emb)
        end = start + t
        for layer, (kc, vc) in zip(self.layers, cache, strict=True):
            qkv = F.linear(self._rms(x, layer["n1"]), layer["qkv"]).view(bs, t, nq + 2 * nkv, hd)
            # RoPE on q and k at once; interleaved pairs are complex numbers
            # (train/model.py's apply_rope layout).
            qk = qkv[:, :, : nq + nkv].float().reshape(bs, t, nq + nkv, hd // 2, 2)
            qk = torch.view_as_real(torch.view_as_complex(qk) * rot).flatten(3).type_as(x)
            kc[:, :, start:end] = qk[:, :, nq:].transpose(1, 2)
            vc[:, :, start:end] = qkv[:, :, nq + nkv :].transpose(1, 2)
            if t == 1:
                # Decode: a kv head's query group is a 'sequence' of `group`
                # queries under one mask: no repeated k/v, the fast kernel.
                q = qk[:, 0, :nq].reshape(bs, nkv, group, hd)
                o = F.scaled_dot_product_attention(q, kc[:, :, :end], vc[:, :, :end], attn_mask=mask)
                o = o.reshape(bs, 1, nq * hd)
            else:
                q = qk[:, :, :nq].transpose(1, 2)
                o = F.scaled_dot_product_attention(
                    q, kc[:, :, :end], vc[:, :, :end], attn_mask=mask, enable_gqa=group > 1
                )
                o = o.transpose(1, 2).reshape(bs, t, nq * hd)
            x = x + F.linear(o, layer["wo"])
            g, u = F.linear(self._rms(x, layer["n2"]), layer["w13"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(g) * u, layer["w2"])
        return F.linear(self._rms(x[:, -1], self.norm), self.out).float()


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
def generate_batch(
    dec: KVDecoder,
    prompts: list[list[int]],
    s: Sampling,
    device: torch.device,
    gen: torch.Generator | None = None,
) -> list[tuple[list[int], str]]:
    """(new tokens without the EOS, finish reason "eos" | "length") per prompt."""
    from train.model import rope_cos_sin

    bs, plen = len(prompts), max(len(p) for p in prompts)
    total = plen + s.max_new_tokens
    dtype = dec.emb.dtype
    m = dec.m
    tokens = torch.zeros(bs, plen, dtype=torch.long)
    valid = torch.zeros(bs, total, dtype=torch.bool)
    for i, p in enumerate(prompts):
        tokens[i, plen - len(p) :] = torch.tensor(p)
        valid[i, plen - len(p) :] = True  # generated slots count as valid once written
    tokens, valid = tokens.to(device), valid.to(device)
    pad = (plen - torch.tensor([len(p) for p in prompts], device=device)).unsqueeze(1)
    pos = (torch.arange(plen, device=device).unsqueeze(0) - pad).clamp(min=0)
    cs = rope_cos_sin(dec.head_dim, total, m.rope_theta, device=device, m=m)
    rope = torch.complex(cs[..., 0], cs[..., 1])  # [total, hd/2]
    cache = [
        (
            torch.empty(bs, m.n_kv_heads, total, dec.head_dim, device=device, dtype=dtype),
            torch.empty(bs, m.n_kv_heads, total, dec.head_dim, device=device, dtype=dtype),
        )
        for _ in dec.layers
    ]
    idx = torch.arange(plen, device=device)
    causal = idx.view(1, 1, plen, 1) >= idx.view(1, 1, 1, plen)
    # A padding query attends to itself only, so its (ignored) row stays finite.
    allowed = (causal & valid[:, None, None, :plen]) | torch.eye(plen, dtype=torch.bool, device=device)
    logits = dec(tokens, rope[pos].unsqueeze(2), 0, cache, _additive(allowed, dtype))
    # Decode masks: padding slots never attended; the rest once written.
    step_masks = _additive(valid[:, None, None, :], dtype)
    out = torch.empty(bs, s.max_new_tokens, dtype=torch.long, device=device)
    finished = torch.zeros(bs, dtype=torch.bool, device=device)
    lengths = torch.full((bs,), s.max_new_tokens, dtype=torch.long, device=device)
    eos = torch.tensor(s.eos, dtype=torch.long, device=device) if s.eos else None
    last = pos[:, -1]
    n = 0
    for n in range(s.max_new_tokens):
        nxt = pick(logits, s, gen)
        out[:, n] = nxt
        if eos is not None:
            hit = torch.isin(nxt, eos) & ~finished
            lengths = torch.where(hit, torch.full_like(lengths, n), lengths)
            finished |= hit
            # One host sync per token: cheap next to a forward, and it ends
            # the batch as soon as every sequence is done.
            if bool(finished.all()):
                break
        if n == s.max_new_tokens - 1:
            break
        last = last + 1
        slot = plen + n
        logits = dec(
            nxt.unsqueeze(1), rope[last].view(bs, 1, 1, -1), slot, cache, step_masks[..., : slot + 1]
        )
    out_cpu, len_cpu = out[:, : n + 1].tolist(), lengths.tolist()
    return [
        (row[: min(k, n + 1)], "eos" if k < s.max_new_tokens and k <= n else "length")
        for row, k in zip(out_cpu, len_cpu, strict=True)
    ]


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


def build_decoder(spec: RunSpec, device: torch.device) -> tuple[KVDecoder, str]:
    """One whole model on this rank from the job's weights."""
    from train.hf import load_job_weights
    from train.model import Llama

    with torch.device("meta"):
        model = Llama(spec.cfg.model)
    model.to_empty(device=device)
    source = load_job_weights([model], spec, no_dist=True)
    if spec.plan.precision == "bf16":
        model.to(torch.bfloat16)
    model.requires_grad_(False)
    return KVDecoder(model), source


def array_task() -> tuple[int, int]:
    """(task index, task count) of a Slurm job array; (0, 1) otherwise."""
    tid = os.environ.get("SLURM_ARRAY_TASK_ID", "")
    count = os.environ.get("SLURM_ARRAY_TASK_COUNT", "")
    if tid and count:
        return int(tid) - int(os.environ.get("SLURM_ARRAY_TASK_MIN", "0") or 0), int(count)
    return 0, 1


def run_generate(spec: RunSpec, info: DistInfo, log: RunLog, flag: PreemptFlag) -> int:
    from tokenizers import Tokenizer

    j = spec.cfg.job
    device = torch.device(info.device)
    task, tasks = array_task()
    if tasks == 1 and j.array_tasks > 1:
        tasks = j.array_tasks  # outside Slurm: task index 0 of the planned count
    shard, n_shards = task * info.world_size + info.rank, tasks * info.world_size
    prompts = read_prompts(j.prompts)
    out = output_path(spec)
    parts = parts_dir(out)
    parts.mkdir(parents=True, exist_ok=True)
    mine_file = parts / f"task{task}-rank{info.rank}.jsonl"
    drop_torn_tail(mine_file)
    done = done_indices(parts)
    todo = [i for i in range(shard, len(prompts), n_shards) if i not in done]
    tok = Tokenizer.from_file(j.tokenizer)
    if tok.get_vocab_size() > spec.cfg.model.vocab_size:
        raise ConfigError(
            f"job.tokenizer={j.tokenizer} has {tok.get_vocab_size()} tokens, more than "
            f"model.vocab_size={spec.cfg.model.vocab_size}: not this model's tokenizer"
        )
    encoded = {i: tok.encode(prompts[i]["prompt"]).ids for i in todo}
    # Similar lengths together: less padding per batch.
    todo.sort(key=lambda i: (-len(encoded[i]), i))
    dec, source = build_decoder(spec, device)
    s = Sampling(j.max_new_tokens, j.temperature, j.top_p, eos_ids(spec))
    gen = torch.Generator(device=device).manual_seed(spec.cfg.train.seed * 1000 + shard)
    log.print(
        f"generate: {len(prompts)} prompts, {len(done)} already done; {n_shards} shards "
        f"({tasks} array task(s) x {info.world_size} ranks); weights: {source}"
    )
    t0, new_tokens, written = time.perf_counter(), 0, 0
    status = "completed"
    with open(mine_file, "a") as f:
        for b in range(0, len(todo), j.batch_size):
            if flag.is_set():
                status = "preempted"
                break
            batch = todo[b : b + j.batch_size]
            results = generate_batch(dec, [encoded[i] for i in batch], s, device, gen)
            for i, (ids, reason) in zip(batch, results, strict=True):
                rec = {"index": i}
                if "id" in prompts[i]:
                    rec["id"] = prompts[i]["id"]
                rec.update(
                    {
                        "prompt": prompts[i]["prompt"],
                        "completion": tok.decode(ids, skip_special_tokens=True),
                        "completion_tokens": ids,
                        "finish_reason": reason,
                    }
                )
                f.write(json.dumps(rec) + "\n")
                new_tokens += len(ids)
            f.flush()
            os.fsync(f.fileno())
            written += len(batch)
            log.print(f"generate: rank {info.rank}: {written}/{len(todo)} of its prompts")
    dt = time.perf_counter() - t0
    if status == "preempted":
        log.result(written, None, "preempted", completions=written)
        log.print("generate: preempted between batches; a requeue resumes where this stopped")
        return REQUEUE_EXIT_CODE
    merged = merge_if_complete(parts, out, len(prompts))
    rate = new_tokens / dt if dt > 0 else 0.0
    log.print(
        f"generate: rank {info.rank} wrote {written} completions, {new_tokens} tokens, {rate:,.0f} tokens/s"
        + (f"; all {len(prompts)} in {out}" if merged else "")
    )
    log.result(written, None, "completed", completions=written, tokens_per_s=rate, output=str(out))
    return 0
