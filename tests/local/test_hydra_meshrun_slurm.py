"""hydra/launcher=meshrun_slurm against Hydra's own launcher test suites
(hydra.test_utils.launcher_common_tests, as hydra-submitit-launcher's tests
run them) in its local mode (hydra.launcher.cluster=local, the default):
every point pickled, run by meshrun's local job=script run
(launcher/taskwrap/wrapper.py under run/local.py), its JobReturn read back.

All of LauncherTestSuite runs; of IntegrationTestSuite (a subprocess per
app, ~2 s a test here), one case of each test is kept for CI time: the
parametrized repeats of test_custom_task_name and
test_custom_sweeper_run_workdir test Hydra's naming, not the launcher, and
test_to_absolute_path_multirun repeats test_get_orig_dir_multirun's
working-directory check. All 20 pass (run the whole suites with
MESHRUN_HYDRA_FULL=1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from pytest import param

APP = Path(__file__).resolve().parents[1] / "programs" / "hydra_app.py"
ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("MESHRUN_HYDRA_FULL") == "1"


@pytest.fixture(autouse=True)
def _fresh_hydra_version_base() -> None:
    """Hydra's suites expect a fresh process: an earlier test's
    ``initialize_config_dir(version_base=None)`` (launcher.config.compose)
    leaves Hydra's process-wide version base at 1.3 (no chdir), where the
    suites' 1.1 defaults (chdir) are assumed."""
    from hydra import version

    version.VersionBase.instance().version_base = version._UNSPECIFIED_  # as a fresh process has it


@pytest.mark.parametrize("launcher_name, overrides", [("meshrun_slurm", [])])
class TestMeshrunSlurmLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [({}, ["-m", "hydra/launcher=meshrun_slurm"])])
class TestMeshrunSlurmLauncherIntegration(IntegrationTestSuite):
    if not FULL:
        test_to_absolute_path_multirun = None  # type: ignore[assignment]

        @pytest.mark.parametrize(
            "task_config, overrides, filename, expected_name",
            [param(None, ["hydra.job.name=overridden_name"], "no_config.py", "overridden_name", id="name")],
        )
        def test_custom_task_name(  # type: ignore[override]
            self, tmpdir, task_config, overrides, filename, expected_name, task_launcher_cfg, extra_flags
        ) -> None:
            super().test_custom_task_name(
                tmpdir, task_config, overrides, filename, expected_name, task_launcher_cfg, extra_flags
            )

        @pytest.mark.parametrize(
            "task_config, overrides, expected_dir",
            [
                param(
                    {
                        "hydra": {"sweep": {"dir": "hydra_cfg", "subdir": "${hydra.job.override_dirname}"}},
                        "a": 1,
                    },
                    ["a=1,2"],
                    "hydra_cfg/a=2",
                    id="subdir:override_dirname",
                )
            ],
        )
        def test_custom_sweeper_run_workdir(  # type: ignore[override]
            self, tmpdir, task_config, overrides, expected_dir, task_launcher_cfg, extra_flags
        ) -> None:
            super().test_custom_sweeper_run_workdir(
                tmpdir, task_config, overrides, expected_dir, task_launcher_cfg, extra_flags
            )


def app(tmp_path: Path, *overrides: str, sweep: str = "sweep") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        str(APP),
        "-m",
        "hydra/launcher=meshrun_slurm",
        f"hydra.sweep.dir={tmp_path}/{sweep}",
    ]
    return subprocess.run(
        [*cmd, *overrides], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_raising_task_function_fails_its_point_and_refusals_name_the_key(tmp_path: Path) -> None:
    # The function raises (x=0): Hydra re-raises it from the JobReturn; meshrun saw a failed program.
    out = app(tmp_path, "+x=0", "hydra.job.chdir=true")
    assert out.returncode == 1 and "ZeroDivisionError" in out.stderr, out.stdout + out.stderr
    failures = (tmp_path / "sweep" / "0" / "failures.log").read_text()
    assert "ZeroDivisionError: x=0: the app's own error" in failures, failures
    assert "meshrun_slurm: #0 +x=0: FAILED" in out.stdout + out.stderr, out.stdout
    # additional_parameters that meshrun's script sets itself, or a control character: refused by name.
    out = app(tmp_path, "+x=1", "+hydra.launcher.additional_parameters.time=5", sweep="refused1")
    assert out.returncode == 2 and "hydra.launcher.additional_parameters.time" in out.stderr, out.stderr
    # One line, as meshrun says it, not a traceback ending in it.
    assert "Traceback" not in out.stderr and out.stderr.strip().splitlines()[-1].startswith("meshrun: error:")
    # tasks_per_node other than the tasks meshrun starts (one; local: one process).
    out = app(tmp_path, "+x=1", "hydra.launcher.tasks_per_node=4", sweep="refused2")
    assert "hydra.launcher.tasks_per_node=4 is invalid" in out.stderr, out.stderr
    # Over SSH (a login node named) the results stay on the cluster: waiting is refused by name, before any connection.
    out = app(
        tmp_path, "+x=1", "hydra.launcher.cluster=testcluster", "hydra.launcher.login=alice@login1",
        'hydra.launcher.overrides=["launcher.runs_root=/shared/runs"]', sweep="refused3",
    )  # fmt: skip
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "meshrun: error: hydra.launcher.wait=True is invalid: over SSH (cluster.login=alice@login1)"
        )
    ), out.stderr
    # Refused before anything of meshrun's was written (Hydra's own multirun.yaml aside).
    for refused in ("refused1", "refused2", "refused3"):
        assert sorted(p.name for p in (tmp_path / refused).iterdir()) == ["multirun.yaml"]
