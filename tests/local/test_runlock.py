"""The Slurm owner of a run dir (launcher/run/runlock.py) when Slurm cannot
be asked: refused, naming the failure, never assumed gone. Unit tests of the
check alone (nothing is submitted): Slurm unconfigured (the real squeue with
a missing SLURM_CONF), and a squeue that fails or forgets the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.validate import ConfigError
from launcher.run.runlock import LOCK_FILE, check_slurm_owner, claim_for_submission

ROOT = Path(__file__).resolve().parents[2]


def submitted_run_dir(tmp_path: Path, job_id: str = "4242") -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "slurm").mkdir(parents=True)
    (run_dir / "slurm" / "job.json").write_text(json.dumps({"job_id": job_id, "submitted_at": 0}) + "\n")
    return run_dir


def fake_squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "squeue").write_text(f"#!/bin/bash\n{body}\n")
    (bindir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)


def test_failing_squeue_refuses_naming_the_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = submitted_run_dir(tmp_path)
    fake_squeue(
        tmp_path,
        monkeypatch,
        "echo 'squeue: error: slurm_load_jobs error: Access/permission denied' >&2; exit 1",
    )
    with pytest.raises(ConfigError) as info:
        check_slurm_owner(run_dir)
    msg = str(info.value)
    assert msg.startswith(
        f"launcher.run_dir='{run_dir}' may be in use: it was submitted to Slurm as job 4242"
    )
    assert "`squeue -j 4242` failed (exit 1)" in msg and "Access/permission denied" in msg
    assert f"remove {run_dir}/slurm/job.json" in msg


def test_a_job_slurm_has_forgotten_or_ended_has_no_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = submitted_run_dir(tmp_path)
    fake_squeue(tmp_path, monkeypatch, "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1")
    check_slurm_owner(run_dir)  # no error: the job is gone


def test_unconfigured_slurm_refuses_a_local_start(tmp_path: Path) -> None:
    """A local start of a run dir last submitted to Slurm, where Slurm's
    commands find no configuration: refused before the run dir is touched."""
    run_dir = submitted_run_dir(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), SLURM_CONF=str(tmp_path / "missing.conf"))
    p = subprocess.run(
        [sys.executable, "-m", "launcher", "model=tiny", f"launcher.run_dir={run_dir}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert p.returncode == 2, p.stdout + p.stderr
    assert "may be in use: it was submitted to Slurm as job 4242" in p.stderr, p.stderr
    assert "missing.conf does not exist" in p.stderr and "Traceback" not in p.stderr
    assert sorted(x.name for x in run_dir.iterdir()) == [LOCK_FILE, "slurm"]  # nothing of a run written


def test_claim_for_submission_undo_leaves_nothing(tmp_path: Path) -> None:
    new = tmp_path / "a" / "new"
    with claim_for_submission(new) as undo:
        assert (new / LOCK_FILE).exists()
        (new / "spec.json").write_text("{}")
        undo.undo()
    assert not (tmp_path / "a").exists()
    old = submitted_run_dir(tmp_path)
    with claim_for_submission(old) as undo:
        (old / "slurm" / "job.json").write_text("changed")
        undo.undo()
    assert sorted(p.name for p in old.rglob("*")) == ["job.json", "slurm"]
    assert json.loads((old / "slurm" / "job.json").read_text())["job_id"] == "4242"
