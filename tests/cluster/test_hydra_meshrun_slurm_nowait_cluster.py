"""hydra/launcher=meshrun_slurm as a drop-in on the test cluster (issue 53,
item 7 and "return at once"): a CPU-only Hydra app swept with
hydra-submitit-launcher's defaults (gpus_per_node=0) gets one task per
point, asks one CPU and its share of memory (sacct), and runs from the code
snapshot taken at submission (the app's module edited afterwards changes
nothing); with hydra.launcher.wait=false the launch returns before the jobs
end, each JobReturn COMPLETED with meshrun's run handle, the sweep's
manifest names them and the handles reach COMPLETED. Hydra's own
LauncherTestSuite runs against wait=false too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hydra.test_utils.launcher_common_tests import LauncherTestSuite
from runviews import assert_views_agree

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]
ROOT = Path(__file__).resolve().parents[2]
APP = """import os, time
import hydra
import helper  # the app's own module, from its directory (the code snapshot in the job)


@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg):
    time.sleep(8)  # still running when a wait=false launch has returned
    value = helper.SCALE * int(cfg.x)
    with open("answer.txt", "w") as f:
        f.write(f"{value} tasks={os.environ.get('WORLD_SIZE')}\\n")
    return value


if __name__ == "__main__":
    main()
"""


def test_cpu_sweep_returns_at_once_one_task_per_point_from_a_snapshot(tmp_path: Path) -> None:
    from launcher.api import Run, follow

    t0 = time.monotonic()
    app, sweep, runs = tmp_path / "app", tmp_path / "runs" / "sweep", tmp_path / "runs"
    app.mkdir()
    (app / "app.py").write_text(APP)
    (app / "helper.py").write_text("SCALE = 10\n")
    cmd = [
        sys.executable, "app.py", "-m", "+x=2,3", "hydra.job.chdir=true", f"hydra.sweep.dir={sweep}",
        "hydra/launcher=meshrun_slurm", "hydra.launcher.cluster=testcluster",  # the switch
        "hydra.launcher.timeout_min=5", "hydra.launcher.wait=false",
        f'hydra.launcher.overrides=["launcher.runs_root={runs}"]',
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, cwd=app, env=env, capture_output=True, text=True, timeout=240)
    returned_s = time.monotonic() - t0
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    (app / "helper.py").write_text("SCALE = 1000\n")  # the checkout edited after submission
    # Returned before the jobs ended: no point has its result yet.
    assert not any((sweep / str(n) / "hydra_result.pkl").exists() for n in (0, 1)), log
    assert "wait=false: returning at once" in log, log
    manifest = json.loads((sweep / "manifest.json").read_text())
    assert [p["run_dir"] for p in manifest["points"]] == [str(sweep / "0"), str(sweep / "1")], manifest
    handles = follow(sweep)
    assert all(isinstance(h, Run) and h.job_id for h in handles), handles
    for h in handles:
        assert h.wait(timeout_s=180, poll_s=1).state == "COMPLETED", h.logs()
    status = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "status", str(sweep)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert status.returncode == 0 and status.stdout.count("COMPLETED") >= 2, status.stdout + status.stderr
    for h in handles:  # status, fleet, the page, the API and goodput.json: one record of each point
        assert_views_agree(Path(h.run_dir), runs, [h.job_id], state="COMPLETED", step=None)
    for num, x in enumerate((2, 3)):
        # One task (WORLD_SIZE 1), the snapshot's helper (10, not 1000).
        assert (sweep / str(num) / "answer.txt").read_text() == f"{10 * x} tasks=1\n"
    array = manifest["points"][0]["array"]
    tres = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", str(array), "-o", "JobID,AllocTRES"],
        capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    rows = [r.split("|") for r in tres.strip().splitlines()]
    assert len(rows) == 2, tres
    for _job, alloc in rows:  # one CPU, 1/64 of the node's memory (less headroom), no GPU
        assert "cpu=1," in alloc and "mem=3G" in alloc and "gres/gpu" not in alloc, tres
    print(
        f"meshrun_slurm wait=false: returned in {returned_s:.1f} s, all done {time.monotonic() - t0:.0f} s wall"
    )


NOWAIT_RUNS = Path(tempfile.gettempdir()) / "meshrun-hydra-nowait-runs"


class _Followed:
    """A Hydra sweep whose wait=false JobReturns are followed to their end
    (each value a meshrun Run handle, COMPLETED) before the suite looks at
    the job dirs: the suite checks the job's own log, which the job writes."""

    def __init__(self, sweep: Any) -> None:
        self.sweep = sweep

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sweep, name)

    def __enter__(self) -> Any:
        from launcher.api import Run

        out = self.sweep.__enter__()
        for batch in self.sweep.returns or []:
            for ret in batch:
                assert isinstance(ret.return_value, Run), ret
                assert ret.return_value.wait(timeout_s=180, poll_s=0.5).state == "COMPLETED", (
                    ret.return_value.logs()
                )
        return out

    def __exit__(self, *exc: Any) -> Any:
        return self.sweep.__exit__(*exc)


@pytest.fixture
def hydra_sweep_runner(hydra_sweep_runner: Any) -> Any:
    return lambda *args, **kwargs: _Followed(hydra_sweep_runner(*args, **kwargs))


@pytest.mark.parametrize(
    "launcher_name, overrides",
    [
        (
            "meshrun_slurm",
            [
                "hydra.launcher.cluster=testcluster",
                "hydra.launcher.wait=false",
                "hydra.launcher.timeout_min=5",
                f'hydra.launcher.overrides=["launcher.runs_root={NOWAIT_RUNS}"]',
            ],
        )
    ],
)
class TestMeshrunSlurmNoWait(LauncherTestSuite):
    """Every test of the suite but one applies: the JobReturns' overrides,
    cfg, hydra_cfg, job id/num and the job dir's .hydra/ are there at
    submission, the handles are followed to COMPLETED (_Followed) before the
    job's log is looked at. test_sweep_with_custom_resolver asserts the task
    function's return value, which wait=false replaces by the run's handle by design."""

    test_sweep_with_custom_resolver = None  # type: ignore[assignment]
