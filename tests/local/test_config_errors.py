"""Bad overrides fail before anything runs: non-zero exit, one message naming
the field, the bad value and the valid choices or range.
Tests that start no process: tests/unit/test_config_errors_units.py."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["qos=bogus"], "unknown qos option 'bogus' (qos=bogus): choose one of"),
        (["model=405b", "cluster=1node", "launcher.dry_run=true"], "does not fit"),
        (["train.global_batch_size=7"], "train.global_batch_size=7"),
    ],
)
def test_cli_exits_non_zero_before_running(overrides: list[str], expected: str, tmp_path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", *overrides, f"launcher.run_dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert expected in proc.stdout + proc.stderr
    assert not (run_dir / "spec.json").exists()  # nothing was started


def test_missing_dataset_fails_before_ranks_start(tmp_path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher",
            "data=tokens",
            f"data.path={tmp_path / 'nope'}",
            f"launcher.run_dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "data" in proc.stderr and str(tmp_path / "nope") in proc.stderr
    assert not (run_dir / "logs").exists()  # no rank was started


def test_import_launcher_keeps_torch_out() -> None:
    code = (
        "import importlib, pkgutil, sys, launcher\n"
        "for m in pkgutil.iter_modules(launcher.__path__):\n"
        "    importlib.import_module('launcher.' + m.name)\n"
        "bad = [m for m in ('torch', 'nvidia.dali', 'pynvml') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
