"""README's Slurm walkthrough, run as written on the local test cluster.

The lines come from README.md (between the ``slurm-walkthrough`` markers), so
the README cannot drift from what works: the first submission with the
testcluster preset and the default QOS is accepted, trains, and the status,
logs and cancel lines answer for it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import wait_job
from testcluster_util import require_test_cluster

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm_env")]  # wait_job: squeue


def walkthrough_lines() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- slurm-walkthrough -->\n```bash\n(.*?)```\n<!-- /slurm-walkthrough -->", text, re.S)
    assert m, "README.md lost its slurm-walkthrough block"
    return [shlex.split(line, comments=True) for line in m.group(1).splitlines() if line.strip()]


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "python", argv  # README's commands run in the activated venv
    for _ in range(12):
        p = subprocess.run(
            [sys.executable, *argv[1:]], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
        )
        if p.returncode != 3:  # 3: Slurm unreachable (the shared test cluster restarting)
            break
        time.sleep(10)
    assert p.returncode == 0, f"{shlex.join(argv)} failed:\n{p.stdout}\n{p.stderr}"
    return p


def test_readme_slurm_walkthrough_runs_as_written(tmp_path: Path) -> None:
    env = dict(os.environ, SLURM_CONF=require_test_cluster(), PYTHONPATH=str(ROOT))
    submit, status, logs, cancel = walkthrough_lines()
    assert submit == ["python", "-m", "launcher", "cluster=testcluster"]  # no overrides: the first try

    out = run(submit, env, tmp_path).stdout
    assert "share" not in out  # the preset fits the default QOS as it is: nothing to say
    job = re.search(r"meshrun: submitted job (\d+)", out)
    run_dir = re.search(r"meshrun: run dir (\S+)", out)
    assert job and run_dir, out
    job_id, run_dir = job.group(1), run_dir.group(1)
    assert Path(run_dir).is_relative_to(tmp_path / "runs" / "tiny-testcluster")

    def with_dir(argv: list[str]) -> list[str]:
        assert "RUN_DIR" in argv, argv
        return [run_dir if a == "RUN_DIR" else a for a in argv]

    # While the job is queued or runs, the status line names it; once it
    # ended (squeue's word: a status run costs the job's CPUs seconds), its
    # final row.
    table = run(with_dir(status), env, tmp_path).stdout
    row = next(line for line in table.splitlines() if job_id in line)
    assert wait_job(job_id, 600)["state"] == "COMPLETED", table
    table = run(with_dir(status), env, tmp_path).stdout
    row = next(line for line in table.splitlines() if job_id in line)
    assert " COMPLETED " in row, table
    assert " 40/40 " in row, table  # train.steps=40 by default
    assert float(row.split()[row.split().index("40/40") + 1]) > 0  # the loss column

    tail = run(with_dir(logs), env, tmp_path).stdout
    assert f"job {job_id}" in tail and "step 40/40 | loss" in tail and "done: step 40" in tail

    done = run(with_dir(cancel), env, tmp_path).stdout
    assert f"(job {job_id}) already COMPLETED; nothing to cancel" in done
