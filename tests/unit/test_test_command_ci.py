"""CI (.ci/run) calls exactly the one test command, scripts/test.sh (the rest:
tests/local/test_test_command_dry.py, tests/cluster/test_test_command.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_exactly_the_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    runs = [line for line in ci.splitlines() if "pytest" in line and not line.lstrip().startswith("#")]
    assert runs == [], runs  # pytest only through scripts/test.sh
    assert "bash scripts/test.sh || rc=$?" in ci and "export CI=true" in ci
    assert "ruff check . && ruff format --check ." in ci and "policy-rc.d" in ci
