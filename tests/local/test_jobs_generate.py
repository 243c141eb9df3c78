"""job=generate on a small transformers-built Llama: greedy tokens identical
to transformers' generate for the same prompts (2 ranks, batched with left
padding, KV cache); a run killed mid-file (plus a torn last line) and
resumed writes every prompt's completion exactly once."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers
from jobs_util import HF_TINY, make_hf_dir, make_run
from tokenizers import Tokenizer

from launcher.config.compose import compose
from launcher.config.runfiles import REQUEUE_EXIT_CODE
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan
from launcher.run.local import free_port, rank_env, run_local

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "hello",
    "world",
    "tell",
    "me",
    "story",
    "about",
    "cat",
    "cluster",
    "runs",
    "jobs",
]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return make_hf_dir(tmp_path_factory.mktemp("hf_gen"))


def write_prompts(path: Path, n: int) -> Path:
    lines = [
        {"id": f"q{i}", "prompt": " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(1 + i % 9))}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("tp", [1, 2])
def test_greedy_matches_transformers_generate(hf_dir, tmp_path, tp) -> None:
    """tp=1: two replicas split the prompts; tp=2: one replica whose ranks
    hold half the heads (KV cache included) and read half the weights."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 10)
    spec = make_run(
        tmp_path / "run",
        [
            "job=generate",
            "model=hf",
            f"job.hf_path={hf_dir}",
            f"job.prompts={prompts}",
            "job.max_new_tokens=12",
            "job.batch_size=3",
            f"parallelism.tp={tp}",
        ],
    )
    assert spec.cfg.qos.name == "inference"
    assert spec.plan.tp == tp
    rc = run_local(spec, echo=None)
    assert rc == 0, "\n".join(
        f"{p.name}: {p.read_text()[-3000:]}" for p in sorted(Path(spec.run_dir, "logs").glob("*"))
    )
    log = (Path(spec.run_dir) / "logs/rank0.log").read_text()
    assert f"replica(s) of tp={tp}" in log
    read_mb = float(re.search(r"\(([0-9.]+) MB read by this rank\)", log).group(1))
    whole_mb = (hf_dir / "model.safetensors").stat().st_size / 1e6
    # The norms are replicated: a shard is a bit over 1/tp of the file.
    assert read_mb <= whole_mb / tp + 0.02, (read_mb, whole_mb)
    out = read_jsonl(Path(spec.run_dir) / "completions.jsonl")
    assert [r["index"] for r in out] == list(range(10))
    assert [r["id"] for r in out] == [f"q{i}" for i in range(10)]
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    model = transformers.LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    for r in out:
        ids = tok.encode(r["prompt"]).ids
        ref = model.generate(
            torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=2, pad_token_id=0
        )[0, len(ids) :].tolist()
        reason = "eos" if ref and ref[-1] == 2 else "length"
        ref = ref[:-1] if reason == "eos" else ref
        assert r["completion_tokens"] == ref, (r["index"], r["completion_tokens"], ref)
        assert r["finish_reason"] == reason
        assert r["completion"] == tok.decode(ref, skip_special_tokens=True)


def test_preempted_or_killed_mid_file_and_resumed_writes_each_prompt_once(hf_dir, tmp_path) -> None:
    n = 120
    prompts = write_prompts(tmp_path / "prompts.jsonl", n)
    out = tmp_path / "out" / "completions.jsonl"
    spec = make_run(
        tmp_path / "run",
        [
            "job=generate",
            "model=hf",
            f"job.hf_path={hf_dir}",
            f"job.prompts={prompts}",
            f"job.output={out}",
            "job.max_new_tokens=24",
            "job.batch_size=1",
        ],
    )
    parts = out.with_name("completions.jsonl.parts")
    # The ranks exactly as launcher.run.local starts them, so they can be killed.
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "train", spec.run_dir],
            env=rank_env(spec, r, port),
            stdout=open(tmp_path / f"rank{r}.out", "w"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]

    def done_lines() -> int:
        return sum(len(p.read_text().splitlines()) for p in parts.glob("*.jsonl")) if parts.exists() else 0

    deadline = time.monotonic() + 240
    while done_lines() < 6 and time.monotonic() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.02)
    # Rank 0 is preempted (USR2, as Slurm sends before a preemption / time
    # limit): it stops between batches and asks for a requeue. Rank 1 is
    # killed outright, possibly in the middle of a write.
    procs[0].send_signal(signal.SIGUSR2)
    procs[1].send_signal(signal.SIGKILL)
    assert procs[0].wait(timeout=120) == REQUEUE_EXIT_CODE, (tmp_path / "rank0.out").read_text()[-3000:]
    procs[1].wait()
    assert json.loads((Path(spec.run_dir) / "result.json").read_text())["status"] == "preempted"
    before = done_lines()
    assert 6 <= before < n, before  # stopped mid-file
    assert not out.exists()
    # A line torn by the kill (a write cut short) must not count as done.
    with open(parts / "task0-rank1.jsonl", "a") as f:
        f.write('{"index": 1, "completion": "cut sh')
    assert run_local(spec, echo=None) == 0, (Path(spec.run_dir) / "logs/rank0.log").read_text()[-3000:]
    log = (Path(spec.run_dir) / "logs/rank0.log").read_text()
    assert "already done" in log
    final = read_jsonl(out)
    assert [r["index"] for r in final] == list(range(n))
    assert all(r["finish_reason"] in ("eos", "length") and len(r["completion_tokens"]) <= 24 for r in final)
    # Every part line is whole and no prompt was generated twice.
    written = [r["index"] for p in sorted(parts.glob("*.jsonl")) for r in read_jsonl(p)]
    assert sorted(written) == list(range(n))


def test_requeued_under_tensor_parallel_resumes_each_prompt_once(hf_dir, tmp_path) -> None:
    """tp=2: USR2 reaches one rank only; both stop at the same step (or the
    other would hang in its next all-reduce), ask for a requeue, and the
    resumed run writes every prompt exactly once."""
    n = 40
    prompts = write_prompts(tmp_path / "prompts.jsonl", n)
    spec = make_run(
        tmp_path / "run",
        [
            "job=generate",
            "model=hf",
            f"job.hf_path={hf_dir}",
            f"job.prompts={prompts}",
            "job.max_new_tokens=24",
            "job.batch_size=2",
            "parallelism.tp=2",
        ],
    )
    out = Path(spec.run_dir) / "completions.jsonl"
    parts = out.with_name("completions.jsonl.parts")
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "train", spec.run_dir],
            env=rank_env(spec, r, port),
            stdout=open(tmp_path / f"rank{r}.out", "w"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]

    def done_lines() -> int:
        return sum(len(p.read_text().splitlines()) for p in parts.glob("*.jsonl")) if parts.exists() else 0

    deadline = time.monotonic() + 240
    while done_lines() < 4 and time.monotonic() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.02)
    procs[0].send_signal(signal.SIGUSR2)
    for r, p in enumerate(procs):
        assert p.wait(timeout=120) == REQUEUE_EXIT_CODE, (tmp_path / f"rank{r}.out").read_text()[-3000:]
    # Only the replica's first rank writes.
    assert [p.name for p in parts.glob("*.jsonl")] == ["task0-rank0.jsonl"]
    before = done_lines()
    assert 4 <= before < n, before
    with open(parts / "task0-rank0.jsonl", "a") as f:
        f.write('{"index": 3, "completion": "cut sh')
    assert run_local(spec, echo=None) == 0, (Path(spec.run_dir) / "logs/rank0.log").read_text()[-3000:]
    assert f"{before} already done" in (Path(spec.run_dir) / "logs/rank0.log").read_text()
    assert [r["index"] for r in read_jsonl(out)] == list(range(n))
    written = [r["index"] for p in sorted(parts.glob("*.jsonl")) for r in read_jsonl(p)]
    assert sorted(written) == list(range(n))


def test_generate_needs_prompts_and_a_tokenizer(hf_dir, tmp_path) -> None:
    with pytest.raises(ConfigError, match="job.prompts"):
        make_plan(compose(["job=generate", "model=hf", f"job.hf_path={hf_dir}"]))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ConfigError, match="line 2"):
        make_plan(compose(["job=generate", "model=hf", f"job.hf_path={hf_dir}", f"job.prompts={bad}"]))
    ok = write_prompts(tmp_path / "p.jsonl", 2)
    ckpt = tmp_path / "run" / "checkpoints" / "step_1"
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match="more than model.vocab_size=64"):
        make_plan(
            compose(
                [
                    "job=generate",
                    "model.vocab_size=64",
                    f"job.checkpoint={tmp_path / 'run'}",
                    f"job.tokenizer={hf_dir / 'tokenizer.json'}",
                    f"job.prompts={ok}",
                ]
            )
        )
    with pytest.raises(ConfigError, match="job.top_p"):
        make_plan(
            compose(["job=generate", "model=hf", f"job.hf_path={hf_dir}", f"job.prompts={ok}", "job.top_p=0"])
        )


def test_top_p_keeps_the_nucleus_and_temperature_zero_is_greedy() -> None:
    from train.jobs.decode import Sampling, pick

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    gen = torch.Generator().manual_seed(0)
    assert pick(logits, Sampling(1), gen).eq(0).all()  # greedy
    drawn = pick(logits, Sampling(1, temperature=1.0, top_p=0.7), gen)
    counts = torch.bincount(drawn, minlength=4).tolist()
    assert counts[2] == counts[3] == 0 and counts[0] > counts[1] > 500, counts  # 0.5 / 0.3 renormalized
    drawn = pick(logits, Sampling(1, temperature=1.0, top_p=1.0), gen)
    assert torch.bincount(drawn, minlength=4).gt(0).all()  # full distribution
    assert pick(logits, Sampling(1, temperature=1.0, top_p=1e-6), gen).eq(0).all()  # nucleus of one


def test_tensor_parallel_from_a_meshrun_checkpoint_equals_one_rank(tmp_path) -> None:
    """A checkpoint saved by a 2-rank FSDP run, read by a tp=2 replica (DCP
    reshards into the TP layout, each rank reading its heads) and by tp=1
    replicas: the same greedy completions."""
    shape = ["model=tiny", "model.vocab_size=128", "model.seq_len=32"]
    train = make_run(
        tmp_path / "train",
        [*shape, "train.steps=2", "storage.save_every_steps=2", "storage.async_save=false"],
    )
    assert run_local(train, echo=None) == 0, (Path(train.run_dir) / "logs/rank0.log").read_text()[-3000:]
    prompts = write_prompts(tmp_path / "prompts.jsonl", 6)
    outs = {}
    for tp in (1, 2):
        spec = make_run(
            tmp_path / f"gen{tp}",
            [
                *shape,
                "job=generate",
                f"job.checkpoint={train.run_dir}",
                f"job.tokenizer={HF_TINY / 'tokenizer.json'}",
                f"job.prompts={prompts}",
                "job.max_new_tokens=10",
                "job.batch_size=4",
                f"parallelism.tp={tp}",
            ],
        )
        assert spec.plan.tp == tp
        assert run_local(spec, echo=None) == 0, (Path(spec.run_dir) / "logs/rank0.log").read_text()[-3000:]
        log = (Path(spec.run_dir) / "logs/rank0.log").read_text()
        assert "weights: checkpoint" in log and f"replica(s) of tp={tp}" in log
        outs[tp] = [r["completion_tokens"] for r in read_jsonl(Path(spec.run_dir) / "completions.jsonl")]
    assert len(outs[1]) == 6 and any(outs[1])
    assert outs[2] == outs[1]
