"""``meshrun``: one command family (launcher/cli/, the pyproject console
script). ``meshrun --help`` lists every command, each command's ``--help``
works, and a command does what its ``python -m`` module does.
Tests that start no process: tests/unit/test_meshrun_cli_units.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = [
    "run",
    "status",
    "logs",
    "cancel",
    "fleet",
    "predict",
    "cost",
    "preflight",
    "nccl",
    "qos-admin",
    "nodes",
    "init",
    "image",
    "snapshot",
    "rerun",
    "pipeline",
    "diff",
]


def meshrun_argv() -> list[str]:
    """The installed console script when this Python has one (the venv that
    scripts/setup.sh makes), else the same entry point by module."""
    script = Path(sys.executable).parent / "meshrun"
    if script.exists() and os.environ.get("PYTHONPATH", "") in ("", str(ROOT)):
        return [str(script)]
    return [sys.executable, "-m", "launcher.cli"]


def meshrun(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*meshrun_argv(), *args], cwd=kw.pop("cwd", ROOT), capture_output=True, text=True, timeout=300, **kw
    )


def test_help_lists_every_command() -> None:
    assert list(COMMANDS) == EXPECTED
    p = meshrun("--help")
    assert p.returncode == 0, p.stderr
    listed = [
        line.split()[0] for line in p.stdout.split("commands:\n", 1)[1].splitlines() if line.startswith("  ")
    ]
    assert listed == EXPECTED


@pytest.mark.parametrize("command", EXPECTED)
def test_each_command_help_works(command: str) -> None:
    p = meshrun(command, "--help")
    assert p.returncode == 0, p.stdout + p.stderr
    text = p.stdout + p.stderr
    if command == "run":
        assert "python -m launcher [group=option ...]" in text and "== Config ==" in text  # Hydra's app help
    else:
        # Its usage names the command as typed, not the module behind it.
        assert f"usage: meshrun {command}" in text, text
        assert "python -m launcher" not in text.split("\n", 1)[0], text
    if command == "image":
        assert "build" in text
    if command in ("status",):
        assert "--watch" in text and "--png" in text
    if command == "fleet":
        assert "--serve" in text and "--budget-usd" in text and "--json" in text


def test_module_usage_keeps_its_python_m_name() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "launcher.image", "--help"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and p.stdout.startswith("usage: python -m launcher.image"), p.stdout + p.stderr


def test_unknown_command_names_the_valid_ones() -> None:
    p = meshrun("sumbit")
    assert p.returncode == 2 and "invalid choice: 'sumbit'" in p.stderr and "'qos-admin'" in p.stderr


def test_commands_do_what_their_modules_do(tmp_path: Path) -> None:
    same = [
        (["nccl", "cluster=4node"], [sys.executable, "-m", "launcher.nccl", "cluster=4node"]),
        (["qos-admin", "slurm-conf"], [sys.executable, "-m", "launcher.qos_admin", "slurm-conf"]),
        (["predict", "model=1b", "cluster=1node"], [sys.executable, "-m", "launcher.predict", "model=1b", "cluster=1node"]),
    ]  # fmt: skip
    for ours, module in same:
        a = meshrun(*ours)
        b = subprocess.run(module, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert a.returncode == b.returncode == 0, a.stderr + b.stderr
        assert a.stdout == b.stdout and a.stdout.strip()
    # run: Hydra's app, with the same refusal and exit code as python -m launcher.
    bad = meshrun("run", "model=nosuch", cwd=tmp_path)
    assert bad.returncode != 0 and "nosuch" in bad.stderr
    dry = meshrun(
        "run", "model=13b", "cluster=4node", "launcher.dry_run=true", f"launcher.run_dir={tmp_path / 'r'}"
    )
    assert dry.returncode == 0, dry.stderr
    # The request as typed: cluster=4node asks for 4 nodes (never shrunk to a QOS share).
    assert "#SBATCH --nodes=4" in dry.stdout and "nothing was started or submitted" in dry.stdout
