"""Unit tests of the Slurm helpers that need no cluster: admin rendering,
time parsing, sacct parsing, status table, signal flag.
Tests that start no process: tests/unit/test_slurm_logic.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launcher.slurm import qospresets as qos_admin


def test_preemption_lines_render_the_user_signal_per_release() -> None:
    assert qos_admin.preemption_lines(True, (23, 2)) == [
        "PreemptType=preempt/qos",
        "PreemptMode=REQUEUE",
        "PreemptParameters=send_user_signal",
    ]
    assert qos_admin.preemption_lines(True, (22, 5))[-1] == "SlurmctldParameters=preempt_send_user_signal"
    assert not any("signal" in line for line in qos_admin.preemption_lines(False, (23, 2)))
    out = subprocess.run(
        [sys.executable, "-m", "launcher.qos_admin", "slurm-conf", "--slurm-version", "x"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "--slurm-version='x' is invalid" in out.stderr


def test_status_cli_without_slurm(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "slurm").mkdir(parents=True)
    (run / "slurm" / "job.json").write_text('{"job_id": "5"}')
    env = {**os.environ, "PATH": os.path.dirname(os.sys.executable)}
    out = subprocess.run(
        [os.sys.executable, "-m", "launcher.status", str(run)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 3 and "no Slurm reachable" in out.stderr
