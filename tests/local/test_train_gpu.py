"""GPU-only checks (skipped without CUDA; scripts/gpu_check.sh runs them):
the NCCL path trains, reports MFU and memory, and computes the same model as
the CPU path."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

# Test harnesses (the layout matrix, the checkpoint drill) live in scripts/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

from parallel_layouts import REFERENCE, Layout, compare, format_row, run_layout  # noqa: E402

from launcher.config.schema import RunConfig  # noqa: E402
from launcher.config.spec import RunSpec, save_spec  # noqa: E402
from launcher.plan.make import make_plan  # noqa: E402
from launcher.run.local import run_local, use_local_gpus  # noqa: E402


@pytest.fixture(autouse=True)
def _tmpdir(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))


def test_nccl_run_trains_with_mfu(tmp_path: Path) -> None:
    cfg = RunConfig()
    use_local_gpus(cfg.cluster)
    cfg.cluster.gpus_per_node = 1  # one GPU: the check fits any machine
    cfg.train.steps, cfg.train.log_every_steps = 30, 5
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path / "run"))
    assert spec.plan.backend == "nccl" and spec.plan.precision == "bf16"
    save_spec(spec)
    assert run_local(spec, echo=None) == 0, (tmp_path / "run" / "logs" / "rank0.log").read_text()[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "event" not in r]
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.5
    assert steps[-1]["peak_mem_gb"] > 0
    if cfg.cluster.gpu_peak_bf16_tflops > 0:
        assert 0 < steps[-1]["mfu"] < 1


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_gpu_fp32_matches_cpu_reference(compiled: bool, tmp_path: Path) -> None:
    """Same model, seed, data on cuda:0 vs one CPU process. Across devices
    kernels differ (reduction order), so the bound is 1e-4, not 1e-5."""
    ref = run_layout(REFERENCE, str(tmp_path))
    assert not ref.error, ref.error
    out = run_layout(Layout("gpu1_fp32", 1, gpus=1, compile=compiled), str(tmp_path))
    compare(out, ref)
    assert not out.error, out.error
    assert out.loss_diff <= 1e-4 and out.grad_norm_diff <= 1e-4, format_row(out)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_gpu_fsdp_matches_one_gpu(tmp_path: Path) -> None:
    n = min(torch.cuda.device_count(), 4)
    one = run_layout(Layout("gpu1", 1, gpus=1), str(tmp_path))
    many = run_layout(Layout(f"gpu{n}_fsdp", n, gpus=n), str(tmp_path))
    compare(many, one)
    assert many.passed, format_row(many)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="context parallel needs 2 GPUs")
def test_gpu_context_parallel_matches_one_gpu(tmp_path: Path) -> None:
    """parallelism.cp=2 (ring attention over 2 GPUs, each holding half of
    every sequence: train/parallel/cp.py) trains as one GPU does: fp32
    (SDPA's efficient kernel, which has a ring implementation), the same
    1e-4 bound as across devices (the ring merges partial softmaxes in
    another order). Not run yet: no 2-GPU machine in CI."""
    one = run_layout(Layout("gpu1", 1, gpus=1), str(tmp_path))
    ring = run_layout(Layout("gpu2_cp2", 2, cp=2, gpus=2), str(tmp_path))
    compare(ring, one)
    assert not ring.error, ring.error
    assert ring.loss_diff <= 1e-4 and ring.grad_norm_diff <= 1e-4, format_row(ring)


def test_visible_devices_are_used() -> None:
    # Guard against a silently CPU-only torch build on the GPU machine.
    assert torch.version.cuda is not None
    assert os.environ.get("CUDA_VISIBLE_DEVICES", "0") != ""


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="train.float8 needs a CUDA GPU with FP8 tensor cores",
)
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_gpu_float8_trains_close_to_bf16(recipe: str, tmp_path: Path) -> None:
    """train.float8 on FP8 tensor cores (no emulation), one GPU: bf16 plans
    FSDP on the 1-rank dim, so tensorwise all-gathers in float8 and
    precomputes its scales; the losses stay near the bf16 run's."""
    losses = {}
    for name in ("off", recipe):
        cfg = RunConfig()
        use_local_gpus(cfg.cluster)
        cfg.cluster.gpus_per_node = 1
        cfg.train.steps, cfg.train.log_every_steps, cfg.train.float8 = 30, 1, name
        run_dir = tmp_path / name
        spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(run_dir))
        save_spec(spec)
        assert run_local(spec, echo=None) == 0, (run_dir / "logs" / "rank0.log").read_text()[-3000:]
        recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [r["loss"] for r in recs if "event" not in r]
        if name != "off":
            assert "on FP8 tensor cores" in (run_dir / "logs" / "rank0.log").read_text()
    gap = max(abs(a - b) for a, b in zip(losses["off"], losses[recipe], strict=True))
    assert 0 < gap < 0.05, gap
    assert losses[recipe][-1] < losses[recipe][0] - 0.5
