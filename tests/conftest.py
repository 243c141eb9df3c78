"""In CI every real part (Slurm test cluster, Prometheus, DALI, S3) is
installed and started by .ci/run, so a test skipped for a missing part there
is a broken setup, not a pass: fail it. Only GPU tests may skip (CI has none)."""

from __future__ import annotations

import os

import pytest

GPU_WORDS = ("CUDA", "GPU")


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
