"""scripts/setup.sh and scripts/apt_install.sh leave no system-wide change
behind: the policy-rc.d that keeps package scripts from starting daemons is
gone when they end, failed or not, and an admin's own one is left alone.
Tests that start no process: tests/unit/test_setup_script_units.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def _stub_env(
    tmp_path: Path, machine: str, *, torch: bool = True, dali_pip_ok: bool = True
) -> dict[str, str]:
    """setup.sh's control flow with a stand-in venv python (records each pip
    call; torch importable or not; DALI's install failing or not) and a
    stand-in ``uname``: which platform gets which install, and what it says."""
    venv, bindir = tmp_path / "venv", tmp_path / "bin"
    (venv / "bin").mkdir(parents=True)
    bindir.mkdir()
    calls = tmp_path / "calls"
    (venv / "bin" / "python").write_text(
        f"""#!/bin/bash
echo "$*" >> {calls}
case "$*" in
  "-c import torch") exit {0 if torch else 1} ;;
  "-c import nvidia.dali") exit 1 ;;
  -c*"print(\\"torch\\""*) echo "torch 9.9.9+stub" ;;
  -m\\ pip\\ download*) exit {0 if dali_pip_ok else 1} ;;
  -m\\ pip\\ install*nvidia*) {"exit 0" if dali_pip_ok else 'echo "ERROR: No matching distribution found for nvidia-dali-cuda120>=1.40"; exit 1'} ;;
esac
exit 0
"""
    )
    (venv / "bin" / "python").chmod(0o755)
    system, node = machine.split()
    (bindir / "uname").write_text(f'#!/bin/sh\ncase "$1" in -s) echo {system} ;; -m) echo {node} ;; esac\n')
    (bindir / "uname").chmod(0o755)
    return dict(
        os.environ,
        PATH=f"{bindir}:{os.environ['PATH']}",
        MESHRUN_VENV=str(venv),
        MESHRUN_WHEEL_CACHE=str(tmp_path / "wheels"),
    )


def _setup(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "scripts/setup.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_dali_is_skipped_with_one_line_where_it_has_no_wheel(tmp_path: Path) -> None:
    p = _setup(_stub_env(tmp_path, "Darwin arm64"))
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stdout.splitlines() if "DALI" in x]
    assert lines == [
        "meshrun setup: DALI skipped: no wheel for Darwin arm64; data loading uses the torch DataLoader",
        "meshrun setup: done: torch 9.9.9+stub, DALI not installed, in " + str(tmp_path / "venv"),
    ]
    calls = (tmp_path / "calls").read_text()
    assert "-m pip install -q --disable-pip-version-check -e .[test,float8]" in calls
    assert "nvidia" not in calls and "torch==" not in calls  # no DALI attempt; the venv's torch kept


def test_dali_install_failure_is_one_line_and_setup_succeeds(tmp_path: Path) -> None:
    p = _setup(_stub_env(tmp_path, "Linux x86_64", dali_pip_ok=False))
    assert p.returncode == 0, p.stderr
    (line,) = [x for x in p.stdout.splitlines() if "DALI skipped" in x]
    assert "pip could not install it (ERROR: No matching distribution found" in line
    assert "uses the torch DataLoader" in line


def test_system_torch_without_a_torch_is_refused(tmp_path: Path) -> None:
    p = _setup(_stub_env(tmp_path, "Linux x86_64", torch=False), "--system-torch")
    assert p.returncode == 1
    assert "--system-torch: " in p.stderr and "has no torch to keep" in p.stderr
