"""In CI every real part (Slurm test cluster, Prometheus, DALI, S3) is
installed and started by .ci/run, so a test skipped for a missing part there
is a broken setup, not a pass: fail it. Only GPU tests may skip (CI has none)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

GPU_WORDS = ("CUDA", "GPU")
# Each test's tier is its folder (docs/contributing.md): tests/unit no
# subprocess, no process group, no server; tests/local processes on this
# machine; tests/cluster the local Slurm test cluster. Marked by folder so
# ``-m unit`` works; shared helpers are in tests/harness.py (no test module
# imports another).
TIERS = ("unit", "local", "cluster")
HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.path)).relative_to(HERE).parts if HERE in item.path.parents else ()
        if parts and parts[0] in TIERS:
            item.add_marker(getattr(pytest.mark, parts[0]))


@pytest.fixture(scope="module")
def slurm_env():  # type: ignore[no-untyped-def]
    """SLURM_CONF of the running test cluster for the module's tests (and
    what they start), restored afterwards; a module opts in with
    ``pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]``."""
    from testcluster_util import require_test_cluster

    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = require_test_cluster()
    yield os.environ["SLURM_CONF"]
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


@pytest.fixture(scope="session", autouse=True)
def venvs_ahead(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The third-party programs' own virtualenvs (a test module's ``VENV =
    (name, pins)``; tests/thirdparty_util.py) for the modules selected to
    run (not a test cluster module's when the cluster is down: its tests
    skip). Built beside a test that mostly waits (``venvs_start``), else when
    first asked for; from the package index in every session either way."""
    from thirdparty_util import VenvsAhead

    wanted: dict[str, tuple[list[str], bool]] = {}
    for item in request.session.items:
        spec = getattr(getattr(item, "module", None), "VENV", None)
        if spec and spec[0] not in wanted:
            wanted[spec[0]] = (spec[1], item.get_closest_marker("slurm") is not None)
    if any(needs for _, needs in wanted.values()) and not _cluster_up():
        wanted = {name: w for name, w in wanted.items() if not w[1]}
    ahead = VenvsAhead(tmp_path_factory, {name: pins for name, (pins, _) in wanted.items()})
    yield ahead
    ahead.stop()


@pytest.fixture
def venvs_start(venvs_ahead):  # type: ignore[no-untyped-def]
    """Start the session's wanted virtualenv builds now, at the lowest CPU
    priority: for a test that mostly waits (sleeps, Slurm's timers), so a
    build's minute or more of pip overlaps it instead of adding to the run.
    Beside a test that keeps the CPUs busy a build still slows it (caches,
    a core's other hardware thread), whatever its priority."""
    venvs_ahead.start_wanted()


def _cluster_up() -> bool:
    from testcluster_util import require_test_cluster

    try:
        require_test_cluster()
    except (pytest.skip.Exception, OSError):  # not started, or no scontrol here
        return False
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") != "true" or not report.skipped:
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(word in reason for word in GPU_WORDS):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every non-GPU part must be present: {reason}"
