"""scripts/gpu_check.sh's parts that CPU can check: the script parses, and
every benchmark it runs plans on one H200 (as nvidia-smi names it) with
each variant fitting its memory and a prediction to print beside it, so a
device session is not spent on a refused plan or an unknown variant."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.perf import predict
from launcher.plan.make import make_plan
from launcher.run.local import use_local_gpus

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _bench_train():
    spec = importlib.util.spec_from_file_location("bench_train", REPO / "scripts" / "bench_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bench_commands() -> list[list[str]]:
    """The bench_train.py argument lists of the script (continuation lines joined)."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    cmds = []
    for line in text.splitlines():
        if "scripts/bench_train.py" in line:
            words = shlex.split(line.split("scripts/bench_train.py", 1)[1].split("2>&1")[0])
            cmds.append(words)
    return cmds


def test_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_every_benchmark_plans_on_one_h200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    bench = _bench_train()
    cmds = _bench_commands()
    assert len(cmds) == 2, cmds
    seen = set()
    for words in cmds:
        overrides = [w for w in words if "=" in w and not w.startswith("--")]
        variants = words[words.index("--variants") + 1].split(",")
        assert "--host-syncs" in words
        base = compose(["cluster=local", *overrides])
        use_local_gpus(base.cluster)
        for name in variants:
            cfg = bench.variant_config(base, name, steps=8, host_syncs=True)
            plan = make_plan(cfg)  # refused plans (memory, validation) raise here
            assert plan.device == "cuda" and plan.world_size == 1 and plan.memory.fits, name
            assert plan.memory.total_gb < 0.9 * plan.memory.capacity_gb, (name, plan.memory.total_gb)
            assert predict(cfg, plan).mfu > 0
            seen.add((cfg.model.dim, name))
    # Issue 37's proof: the 8B shape in bf16, compiled, and compiled with float8.
    assert {(4096, "bf16"), (4096, "bf16+compile"), (4096, "bf16+compile+float8")} <= seen
