"""job=generate: batch inference, JSONL prompts -> JSONL completions.

Layout: replicas of tp ranks each (``parallelism.tp``; the planner picks the
smallest tp whose shard of the model and KV cache fits a GPU). A replica's
ranks hold the model under the training TP plan (train/parallel/parallelize.py's
``apply_tp``: KV cache sharded by heads) and decode the same prompts in
lockstep; replicas and Slurm array tasks take every G-th prompt,
G = array tasks x replicas, and never talk to each other.

Decoding: continuous batching. ``job.batch_size`` sequences are in flight
per replica, one KV cache row ("slot") each, preallocated; when one ends (an
EOS id or ``job.max_new_tokens``) its slot is refilled from the queue at
once, prompts prefilled together (right padding, only the last position's
logits). Fused q/k/v and gate/up projections; greedy or temperature + top-p
sampling (all in :mod:`train.jobs.decode`).

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from launcher.config.datasets import read_prompts
from launcher.config.runfiles import COMPLETIONS_FILE, REQUEUE_EXIT_CODE
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from train.jobs.decode import KVDecoder, Sampling, generate_stream
from train.loop.signals import PreemptFlag
from train.observe.runlog import RunLog
from train.parallel.dist import DistInfo

# ---------------------------------------------------------------- prompts / files


def output_path(spec: RunSpec) -> Path:
    return Path(spec.cfg.job.output or os.path.join(spec.run_dir, COMPLETIONS_FILE))


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
    from train.loop.weights import load_job_weights
    from train.models.llama import Llama
    from train.parallel.parallelize import apply_tp

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
    j = spec.cfg.job
    device = torch.device(info.device)
    task, tasks = array_task()
    if tasks == 1 and j.array_tasks > 1:
        tasks = j.array_tasks  # outside Slurm: task index 0 of the planned count
    tp = spec.plan.tp
    tp_mesh = _tp_mesh(info, tp, device)
    # tp innermost (train/parallel/mesh.py's order): ranks r*tp .. r*tp+tp-1 are one
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
    tok, encoded = _encode(spec, prompts, todo)
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
    t0 = time.perf_counter()
    stop = _stopper(flag, tp, device, dec)
    stream = generate_stream(dec, [encoded[i] for i in todo], s, device, gen, j.batch_size, stop=stop)
    written, new_tokens = _write(stream, todo, prompts, tok, mine_file if writer else None, log, replica, j)
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


def _tp_mesh(info: DistInfo, tp: int, device: torch.device) -> Any:
    """The TP sub-mesh of a replica (None without tensor parallelism)."""
    if tp <= 1:
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (info.world_size // tp, tp), mesh_dim_names=("dp", "tp"))["tp"]


def _encode(spec: RunSpec, prompts: list[dict], todo: list[int]) -> tuple[Any, dict[int, list[int]]]:
    """(the tokenizer, the token ids of each prompt to do)."""
    from tokenizers import Tokenizer

    j = spec.cfg.job
    tok = Tokenizer.from_file(j.tokenizer)
    if tok.get_vocab_size() > spec.cfg.model.vocab_size:
        raise ConfigError(
            f"job.tokenizer={j.tokenizer} has {tok.get_vocab_size()} tokens, more than "
            f"model.vocab_size={spec.cfg.model.vocab_size}: not this model's tokenizer"
        )
    return tok, {i: tok.encode(prompts[i]["prompt"]).ids for i in todo}


def _stopper(flag: PreemptFlag, tp: int, device: torch.device, dec: KVDecoder) -> Callable[[], bool]:
    def stop() -> bool:
        if tp == 1:
            return flag.is_set()
        # Every rank of the replica stops at the same step, or one would
        # wait forever in the next step's all-reduce.
        t = torch.tensor([int(flag.is_set())], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=dec.group)
        return bool(t.item())

    return stop


def _write(
    stream: Iterator[tuple[int, list[int], str]],
    todo: list[int],
    prompts: list[dict],
    tok: Any,
    mine_file: Path | None,
    log: RunLog,
    replica: int,
    j: Any,
) -> tuple[int, int]:
    """Append each completion as it ends (the replica's writer only):
    (completions, new tokens)."""
    new_tokens, written = 0, 0
    with open(mine_file, "a") if mine_file is not None else contextlib.nullcontext() as f:
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
    return written, new_tokens
