"""Calibration fit: recover a known parameter from run directories."""

from __future__ import annotations

import json

import pytest

from launcher.commands import calibrate as fit_cli
from launcher.config.compose import compose
from launcher.config.spec import RunSpec, save_spec
from launcher.perf import calibrate as fitmod
from launcher.perf import load_params, predict
from launcher.perf.params import save_params
from launcher.plan.make import make_plan


def _run_dir(tmp_path, name, overrides, true_params, noise=1.0):
    d = tmp_path / name
    cfg = compose(overrides)
    plan = make_plan(cfg)
    save_spec(RunSpec(cfg, plan, str(d)))
    pred = predict(cfg, plan, true_params)
    t = (pred.step_time_s - pred.breakdown["checkpoint"]) * noise
    with open(d / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"step": 1, "step_time_s": 10 * t}) + "\n")  # warm-up, skipped
        for step in range(2, 8):
            f.write(json.dumps({"step": step, "step_time_s": t, "loss": 1.0}) + "\n")
        f.write(json.dumps({"event": "checkpoint", "step": 7}) + "\n")
    return d


def test_fit_recovers_cpu_rate(tmp_path, capsys):
    # A fixed CPU peak: the fit is about the efficiency, not this host.
    default = load_params().replace(cpu_peak_gflops_per_core=50.0)
    start = tmp_path / "start.yaml"
    save_params(default, start)
    truth = default.replace(cpu_matmul_efficiency=0.12, cpu_step_overhead_s=0.05)
    dirs = [
        _run_dir(tmp_path, "a", ["model=tiny", "train.global_batch_size=8"], truth),
        _run_dir(
            tmp_path,
            "b",
            ["model=tiny", "model.dim=128", "model.ffn_dim=384", "train.global_batch_size=16"],
            truth,
        ),
        _run_dir(tmp_path, "c", ["model=tiny", "model.n_layers=8", "train.global_batch_size=32"], truth),
    ]
    out = tmp_path / "fitted.yaml"
    names = "cpu_matmul_efficiency,cpu_step_overhead_s"
    rc = fit_cli.main([*map(str, dirs), "--perf", str(start), "--params", names, "--out", str(out)])
    assert rc == 0
    fitted = load_params(out)
    assert fitted.cpu_matmul_efficiency == pytest.approx(0.12, rel=0.05)
    assert fitted.cpu_step_overhead_s == pytest.approx(0.05, rel=0.1)
    assert fitted.provenance["cpu"].startswith("fit: ")
    assert "rms log error" in capsys.readouterr().out


def test_fit_rejects_missing_files_and_unknown_params(tmp_path, capsys):
    assert fit_cli.main([str(tmp_path)]) == 2
    d = _run_dir(tmp_path, "a", ["model=tiny"], load_params())
    assert fit_cli.main([str(d), "--params", "no_such_param"]) == 2
    assert "no_such_param" in capsys.readouterr().err


def test_bf16_efficiency_is_fitted_on_bf16_runs_only(tmp_path):
    """fp32 and bf16 kernels reach different shares of their own peaks: each
    efficiency comes back from the runs of its precision, and a set with no
    bf16 run leaves bf16's alone."""
    default = load_params().replace(cpu_peak_gflops_per_core=50.0, cpu_peak_bf16_gflops_per_core=200.0)
    truth = default.replace(cpu_matmul_efficiency=0.3, cpu_bf16_matmul_efficiency=0.08)
    shapes = [
        ["model=tiny", "train.global_batch_size=8"],
        ["model=tiny", "model.dim=128", "model.ffn_dim=384", "train.global_batch_size=16"],
    ]
    runs = [
        fitmod.load_run(_run_dir(tmp_path, f"{prec}{i}", [*ov, f"parallelism.precision={prec}"], truth))
        for prec in ("fp32", "bf16")
        for i, ov in enumerate(shapes)
    ]
    names = fitmod.cpu_params(runs)
    assert "cpu_bf16_matmul_efficiency" in names and "cpu_matmul_efficiency" in names
    fitted = fitmod.fit(runs, default, names)
    assert fitted.cpu_matmul_efficiency == pytest.approx(0.3, rel=0.05)
    assert fitted.cpu_bf16_matmul_efficiency == pytest.approx(0.08, rel=0.05)
    fp32_only = fitmod.cpu_params(runs[:2])
    assert "cpu_bf16_matmul_efficiency" not in fp32_only and "cpu_matmul_efficiency" in fp32_only
