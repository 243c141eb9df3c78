"""Every ``scripts/bench_*.py`` runs in its ``--quick`` mode and prints its
result line, so a bench that rots (an API it calls renamed, a part it needs
gone) fails here instead of on the day someone wants its figures. The
benches are found by glob: a new one without ``--quick`` or without an entry
in RESULTS fails too. Figures are not judged (a 2-core shared host); that a
ratio or time was measured and printed is."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted((ROOT / "scripts").glob("bench_*.py"))
NUM = r"[+-]?\d+(\.\d+)?"

# bench -> the line its run must print (re.MULTILINE); "n/a" where the bench
# prints it for a difference within this host's noise.
RESULTS = {
    "bench_checkpoint": rf"^bench_checkpoint: blocked_ratio=({NUM}|n/a) with_s3=({NUM}|n/a) per_ranks=1:({NUM}|n/a)$",
    "bench_comm_sampler": rf"^bench_comm_sampler: old_over_new=({NUM}|n/a .*)$",
    "bench_container": rf"^bench_container: noreuse_over_reuse={NUM}$",
    "bench_data": rf"^bench_data: dali_vs_pil={NUM}$",
    "bench_fleet": r"^bench_fleet: runs=40 seconds=\d+\.\d+ scheduler_calls=\d+$",
    "bench_generate": rf"^bench_generate\[tiny\]: vs_transformers={NUM}\n(.*\n)*bench_generate: vs_transformers={NUM}$",
    "bench_forecast": r"^bench_forecast: runs=1 scored=1 under_p50=[01] under_p90=[01] mtbf_s=10 ",
    "bench_goodput": r"^Llama 3's rate on 16,384 GPUs: ETTR 0\.9\d\d, \d+ failures per 54 days",
    "bench_heartbeat": rf"^bench_heartbeat: ops_old_over_new={NUM} poll_old_over_new={NUM}$",
    "bench_idle_hog": rf"^bench_idle_hog: slowdown={NUM}$",
    "bench_snapshot": r"^SNAPSHOT generated tree of 2000 files: 2000 files, .* verify \d+\.\d+ s \(\+\d+%\); "
    rf"repeated submission \d+\.\d+ s\nbench_snapshot: verify_over_cached={NUM} \(budget 0\.50\)$",
    "bench_ssh_submit": rf"^bench_ssh_submit: login_node_s={NUM} ssh_s={NUM} ssh_first_s={NUM} ssh_over_login={NUM} "
    rf"whole_kb={NUM} changed_kb={NUM} changed_files=1 changed_over_whole_s={NUM}$",
    "bench_rendezvous": rf"^bench_rendezvous: ranks=256 seconds={NUM} ops_per_s={NUM} at_16384_s={NUM}$",
    "bench_sweep": r"^bench_sweep: sweep4_s=\d+\.\d sweep16_s=\d+\.\d single_s=\d+\.\d$",
    # Each row: the prediction beside the measurement, and the host syncs per step.
    "bench_train": r'^bench_train: \{.*"variant": "bf16", "pred_tokens_per_s_per_gpu": .*"tokens_per_s": '
    r'.*"host_syncs_per_step": \d+\}, \{"variant": "bf16\+ac_full", .*"tokens_per_s": ',
    "bench_upload": rf"^bench_upload: vs_raw={NUM} signing=\S+$",
}
# The ones that submit to (or read the accounting of) the local Slurm test cluster.
SLURM = {"bench_container", "bench_fleet", "bench_forecast", "bench_ssh_submit", "bench_sweep"}
# Generous: a shared 2-core host under load runs these several times slower.
TIMEOUT_S = {"bench_container": 600}


def _param(script: Path) -> object:
    marks = [pytest.mark.slurm] if script.stem in SLURM else []
    return pytest.param(script, id=script.stem, marks=marks)


def test_every_bench_is_known() -> None:
    assert len(BENCHES) >= 12, BENCHES
    assert {s.stem for s in BENCHES} == set(RESULTS), (
        "tests/cluster/test_benches.py RESULTS: add or drop a bench"
    )


@pytest.mark.parametrize("script", [_param(s) for s in BENCHES])
def test_bench_quick(script: Path, request: pytest.FixtureRequest) -> None:
    name = script.stem
    assert name in RESULTS, f"{name}: add its result line to RESULTS in tests/cluster/test_benches.py"
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    assert f"python scripts/{name}.py --quick" in doc, f"{name}'s docstring does not show --quick"
    if name in SLURM:
        request.getfixturevalue("slurm_env")  # skips (fails under CI) without the test cluster
    if name == "bench_container":  # as tests/cluster/test_containers.py: Pyxis and the cached test image
        from testcluster_util import CLUSTER_DIR

        from launcher.slurm.cluster import pyxis_available

        if not pyxis_available():
            pytest.skip("no Pyxis on the test cluster (scripts/testcluster.sh start installs it)")
        if not os.path.isfile(os.path.join(CLUSTER_DIR, "images", "meshrun-test.sqsh")):
            pytest.skip("no test image (scripts/testcluster.sh start builds it)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, str(script), "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S.get(name, 420),
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"{name} --quick exited {p.returncode}:\n{out[-4000:]}"
    assert re.search(RESULTS[name], p.stdout, re.MULTILINE), f"{name}: no result line in:\n{p.stdout[-4000:]}"


@pytest.mark.campaign
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_env")
def test_forecast_campaign_is_calibrated() -> None:
    """12 real runs with kills at a known rate: about half finish by the P50
    ``meshrun status`` printed for them and 90% by its P90 (the bench exits 1
    outside the binomial 99% range). About 15 min: opt-in."""
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_forecast.py"), "--runs", "12"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert re.search(r"^bench_forecast: runs=12 scored=\d+ ", p.stdout, re.MULTILINE), p.stdout
