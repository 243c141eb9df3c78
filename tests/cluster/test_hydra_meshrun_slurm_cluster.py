"""hydra/launcher=meshrun_slurm on the real test cluster: a team's own Hydra
app (tests/programs/hydra_app.py), switched with one override, as a 2-point
sweep: ONE job array, each task the pickled task function under meshrun's
job=script task (taskwrap, supervisor); the JobReturns carry the return
values, the run dirs (Hydra's job dirs) hold the app's file, .hydra/ and
goodput.json, and meshrun fleet lists both runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from submitit.core.utils import pickle_load

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]
ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "tests" / "programs" / "hydra_app.py"


def test_hydra_app_sweep_runs_as_one_job_array_with_its_return_values(tmp_path: Path) -> None:
    t0 = time.monotonic()
    sweep = tmp_path / "runs" / "sweep"
    cmd = [
        sys.executable, str(APP), "-m", "+x=2,3", "hydra.job.chdir=true", f"hydra.sweep.dir={sweep}",
        "hydra/launcher=meshrun_slurm",  # the one-line switch; the rest sizes it for the test cluster
        "hydra.launcher.cluster=testcluster", "hydra.launcher.gpus_per_node=1", "hydra.launcher.timeout_min=5",
        "hydra.launcher.poll_s=1",
        f"hydra.launcher.overrides=['launcher.exclusive=false','launcher.runs_root={tmp_path / 'runs'}']",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    arrays = {
        line.split("job array ")[1].split()[0] for line in log.splitlines() if "submitted job array" in line
    }
    assert len(arrays) == 1, log  # one array for the sweep
    (array,) = arrays
    # The fleet lists both points.
    view = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "fleet", str(tmp_path / "runs"), "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert view.returncode == 0, view.stderr
    listed = {str(Path(r["run_dir"]).resolve()) for r in json.loads(view.stdout)["runs"]}
    assert {str(sweep / "0"), str(sweep / "1")} <= listed, view.stdout
    for num, x in enumerate((2, 3)):
        run_dir = sweep / str(num)
        # What the launch returned: the task's own JobReturn, read back from its result pickle.
        kind, ret = pickle_load(run_dir / "hydra_result.pkl")
        assert kind == "success" and ret.return_value == x * x, (kind, ret)
        assert ret.hydra_cfg.hydra.job.num == num and ret.hydra_cfg.hydra.job.id == f"{array}_{num}"
        assert ret.working_dir == str(run_dir) and ret.overrides == [f"+x={x}"]
        assert f"#{num} +x={x}: COMPLETED, returned {x * x}" in log
        assert (run_dir / "answer.txt").read_text() == f"{x * x}\n"  # the app's file, in its job dir
        assert (run_dir / ".hydra" / "overrides.yaml").exists()
        assert json.loads((run_dir / "slurm" / "job.json").read_text())["job_id"] == f"{array}_{num}"
        good = json.loads((run_dir / "goodput.json").read_text())
        assert good["final"] is True, good
        assert json.loads((run_dir / "result.json").read_text())["status"] == "completed"
    print(f"hydra meshrun_slurm cluster test: {time.monotonic() - t0:.0f} s wall")
