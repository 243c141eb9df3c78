"""scripts/setup.sh and scripts/apt_install.sh leave no system-wide change
behind: the policy-rc.d that keeps package scripts from starting daemons is
gone when they end, failed or not, and an admin's own one is left alone.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_setup_script.py."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_setup_installs_the_dali_range_of_pyproject() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    req = setup.split("DALI_REQ='", 1)[1].split("'", 1)[0]
    assert f'dali = ["{req}"]' in pyproject


def test_setup_torch_index_installs_pyprojects_torch_range() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    spec = setup.split('pip_install "torch', 1)[1].split('"', 1)[0]
    assert f'"torch{spec}",' in pyproject
