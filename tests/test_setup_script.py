"""scripts/setup.sh and scripts/apt_install.sh leave no system-wide change
behind: the policy-rc.d that keeps package scripts from starting daemons is
gone when they end, failed or not, and an admin's own one is left alone."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APT_INSTALL = ROOT / "scripts" / "apt_install.sh"
POLICY = Path("/usr/sbin/policy-rc.d")


def _fake_apt(tmp_path: Path, policy: Path, exit_code: int) -> dict[str, str]:
    """An apt-get that records whether the daemon block was in place while it
    ran, then exits with ``exit_code`` (a failed install)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    seen = tmp_path / "seen"
    (bindir / "apt-get").write_text(
        f'#!/bin/sh\n[ -x "{policy}" ] && "{policy}"; echo "$? $*" >> "{seen}"\nexit {exit_code}\n'
    )
    (bindir / "apt-get").chmod(0o755)
    return dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", MESHRUN_POLICY_RC_D=str(policy))


@pytest.mark.parametrize("exit_code", [0, 100])
def test_policy_rc_d_is_removed_even_on_failure(tmp_path: Path, exit_code: int) -> None:
    policy = tmp_path / "policy-rc.d"
    env = _fake_apt(tmp_path, policy, exit_code)
    p = subprocess.run(["bash", str(APT_INSTALL), "munge"], env=env, capture_output=True, text=True)
    assert p.returncode == exit_code, p.stderr
    seen = (tmp_path / "seen").read_text().splitlines()
    # While apt-get ran, the block answered 101 ("do not start daemons").
    assert seen[0].startswith("101 update")
    if exit_code == 0:
        assert seen[1].startswith("101 install") and seen[1].endswith("munge")
    assert not policy.exists()


def test_an_existing_policy_rc_d_is_left_as_it_was(tmp_path: Path) -> None:
    policy = tmp_path / "policy-rc.d"
    policy.write_text("#!/bin/sh\n# the admin's own\nexit 0\n")
    policy.chmod(0o755)
    env = _fake_apt(tmp_path, policy, 0)
    subprocess.run(["bash", str(APT_INSTALL), "munge"], env=env, check=True)
    assert policy.read_text() == "#!/bin/sh\n# the admin's own\nexit 0\n"


@pytest.mark.slow
def test_setup_test_cluster_leaves_no_policy_rc_d() -> None:
    """The real script as CI runs it; on a machine that still lacks a package
    this installs it from Debian for real."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("--test-cluster needs root and apt-get")
    before = POLICY.exists()
    p = subprocess.run(
        ["bash", "scripts/setup.sh", "--test-cluster"], cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "activate it with: . .venv/bin/activate" in p.stdout
    assert POLICY.exists() == before
    assert (ROOT / ".venv" / "bin" / "python").exists()


def test_setup_refuses_unknown_option_and_helps() -> None:
    p = subprocess.run(["bash", "scripts/setup.sh", "--bogus"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode != 0 and "unknown option --bogus" in p.stderr and "--test-cluster" in p.stderr
    h = subprocess.run(["bash", "scripts/setup.sh", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert h.returncode == 0 and "--system-torch" in h.stdout and "policy-rc.d" in h.stdout


def test_setup_installs_the_dali_range_of_pyproject() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    req = setup.split("DALI_REQ='", 1)[1].split("'", 1)[0]
    assert f'dali = ["{req}"]' in pyproject
