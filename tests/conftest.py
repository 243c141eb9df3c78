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
