"""Performance model: message sizes, monotonic behaviour, degenerate cases,
and the published figures of docs/perf-validation.md.
Tests that start no process: tests/unit/test_perf_model_units.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from launcher.config.compose import compose
from launcher.perf import load_params, predict
from launcher.plan.make import make_plan


def test_import_is_torch_free():
    code = "import sys, launcher.perf, launcher.predict, launcher.cost; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_perf_model_does_not_import_the_planner():
    code = (
        "import sys, launcher.perf, launcher.perf.calibrate, launcher.perf.breakdown, launcher.config.plandata;"
        "assert 'launcher.plan.planner' not in sys.modules, 'perf imports the planner'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_cpu_probe_measures_this_host():
    from launcher.perf import cpu_peak

    peak = cpu_peak.measure()
    assert peak.gflops_per_core > 0.5 and peak.bf16_gflops_per_core > 0.5 and "matmul probe" in peak.how
    assert peak.cores == cpu_peak.host_cores() >= 1


def test_local_gpu_from_nvidia_smi_plans_and_prices(tmp_path, monkeypatch) -> None:
    """cluster=local takes the GPUs nvidia-smi lists; its name ("NVIDIA H200",
    with a space) becomes a plain cluster.gpu_type that validates and picks
    the H200's constants (scripts/gpu_check.sh's benchmarks plan this way)."""
    from launcher.run.local import plain_gpu_name, use_local_gpus

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    cfg = compose(["cluster=local", "model=1b"])
    use_local_gpus(cfg.cluster)
    assert (cfg.cluster.gpus_per_node, cfg.cluster.gpu_type) == (1, "H200")
    assert cfg.cluster.gpu_mem_gb == pytest.approx(140.4, abs=0.1)
    plan = make_plan(cfg)
    assert plan.device == "cuda" and predict(cfg, plan).tokens_per_s_per_gpu > 0
    assert load_params().gpu(cfg.cluster.gpu_type) is load_params().gpus["H200"]
    assert plain_gpu_name("NVIDIA H100 80GB HBM3") == "H100-80GB-HBM3"
