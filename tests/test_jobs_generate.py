"""job=generate on a small transformers-built Llama: greedy tokens identical
to transformers' generate for the same prompts (2 ranks, batched with left
padding, KV cache); a run killed mid-file (plus a torn last line) and
resumed writes every prompt's completion exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers
from jobs_util import make_hf_dir, make_run
from tokenizers import Tokenizer

from launcher.compose import compose
from launcher.local import free_port, rank_env, run_local
from launcher.plan import make_plan
from launcher.validate import ConfigError

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


def test_greedy_matches_transformers_generate(hf_dir, tmp_path) -> None:
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
        ],
    )
    assert spec.cfg.qos.name == "inference"
    assert run_local(spec, echo=None) == 0, (Path(spec.run_dir) / "logs/rank0.log").read_text()[-3000:]
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


def test_killed_mid_file_and_resumed_writes_each_prompt_once(hf_dir, tmp_path) -> None:
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
    # The ranks exactly as launcher.local starts them, so they can be killed.
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "train", spec.run_dir],
            env=rank_env(spec, r, port),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for r in range(2)
    ]

    def done_lines() -> int:
        return sum(len(p.read_text().splitlines()) for p in parts.glob("*.jsonl")) if parts.exists() else 0

    deadline = time.monotonic() + 240
    while done_lines() < 6 and time.monotonic() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.02)
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    before = done_lines()
    assert 6 <= before < n, before  # killed mid-file
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


def test_generate_needs_prompts_and_a_tokenizer(hf_dir, tmp_path) -> None:
    with pytest.raises(ConfigError, match="job.prompts"):
        make_plan(compose(["job=generate", "model=hf", f"job.hf_path={hf_dir}"]))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ConfigError, match="line 2"):
        make_plan(compose(["job=generate", "model=hf", f"job.hf_path={hf_dir}", f"job.prompts={bad}"]))
    ok = write_prompts(tmp_path / "p.jsonl", 2)
    with pytest.raises(ConfigError, match="job.top_p"):
        make_plan(
            compose(["job=generate", "model=hf", f"job.hf_path={hf_dir}", f"job.prompts={ok}", "job.top_p=0"])
        )
