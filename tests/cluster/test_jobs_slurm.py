"""job=generate as a Slurm job array on the local test cluster: 2 array
tasks x 2 ranks split the prompts (every G-th prompt per shard, G = 4) and
the completions file holds each prompt once, in order."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobs_util import make_hf_dir
from testcluster_util import require_test_cluster

pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def slurm_env(monkeypatch):
    monkeypatch.setenv("SLURM_CONF", require_test_cluster())


def test_generate_job_array_splits_prompts(tmp_path: Path) -> None:
    hf_dir = make_hf_dir(tmp_path / "hf")
    n = 12
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"hello world {'cat ' * (i % 4)}"}) + "\n" for i in range(n))
    )
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher",
            "cluster=testcluster",
            "cluster.nodes=1",
            "cluster.gpus_per_node=2",
            "launcher.exclusive=false",
            "qos.time_limit_min=5",
            "job=generate",
            "model=hf",
            f"job.hf_path={hf_dir}",
            f"job.prompts={prompts}",
            "job.array_tasks=2",
            "job.max_new_tokens=6",
            f"launcher.run_dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "meshrun: submitted job" in out.stdout
    completions = run_dir / "completions.jsonl"
    deadline = time.monotonic() + 420  # the shared test cluster may queue it a while
    while not completions.exists() and time.monotonic() < deadline:
        time.sleep(2)
    logs = "\n".join(p.read_text()[-800:] for p in sorted((run_dir / "slurm").glob("*_log.*")))
    assert completions.exists(), logs
    lines = [json.loads(x) for x in completions.read_text().splitlines()]
    assert [r["index"] for r in lines] == list(range(n))
    parts = run_dir / "completions.jsonl.parts"
    for task in range(2):
        for rank in range(2):
            got = [
                json.loads(x)["index"]
                for x in (parts / f"task{task}-rank{rank}.jsonl").read_text().splitlines()
            ]
            assert sorted(got) == list(range(task * 2 + rank, n, 4)), (task, rank, got)
