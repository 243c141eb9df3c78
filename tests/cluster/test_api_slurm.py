"""The Python API (launcher/api.py) on the real test cluster
(scripts/testcluster.sh), with job=script's plain DDP program
(tests/programs/ddp_toy.py): one run submitted, waited for and read back,
a 3-point sweep over job.args submitted as ONE job array, each point's
handle reporting its state, its own step count and its own log, and a
running job cancelled through its handle."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from harness import TOY

from launcher import api

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]


def common(root: Path) -> list[str]:
    return [
        "job=script",
        f"job.script={TOY}",
        "cluster=testcluster",
        "cluster.nodes=1",
        "cluster.gpus_per_node=1",
        "launcher.exclusive=false",
        "qos.time_limit_min=5",
        "launcher.signal_lead_s=30",
        f"launcher.runs_root={root}",
    ]


def test_submit_wait_result_and_a_three_point_sweep_as_one_array(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0 = time.monotonic()
    monkeypatch.chdir(tmp_path)  # the sweep dir: runs/sweeps/<time> here, as for -m
    run = api.submit([*common(tmp_path), "job.args=[--steps,3,--save-every,3]"])
    assert run.job_id and run.job_id.isdigit() and (Path(run.run_dir) / "spec.json").exists(), run
    slow = api.submit([*common(tmp_path), "job.args=[--steps,100,--sleep,1]"])
    points = api.sweep([*common(tmp_path), "job.args=[--steps,2],[--steps,4],[--steps,5]"])
    assert len(points) == 3 and not any(p.reason for p in points), points
    array = points[0].job_id.split("_")[0]
    assert [p.job_id for p in points] == [f"{array}_{i}" for i in range(3)], points  # one array, 3 tasks
    sweeps = list((tmp_path / "runs" / "sweeps").iterdir())
    manifest = json.loads((sweeps[0] / "manifest.json").read_text())
    assert len(sweeps) == 1 and {p["array"] for p in manifest["points"]} == {array}, manifest
    assert {p.status().state for p in points} <= {"-", "PENDING", "RUNNING", "COMPLETED"}
    assert slow.cancel() is True  # running or pending: scancel (its wait overlaps the others')
    t1 = time.monotonic()
    row = run.wait(timeout_s=240, poll_s=2)
    assert row.state == "COMPLETED", run.logs(tail=40)
    res = run.result()
    assert res["status"] == "completed" and res["final_step"] == 3, res
    assert "step 3 loss" in run.logs(rank=0, tail=10)
    for p, steps in zip(points, (2, 4, 5), strict=True):
        assert p.wait(timeout_s=240, poll_s=2).state == "COMPLETED", p.logs(tail=40)
        assert p.result()["final_step"] == steps, p.result()
        log = p.logs(tail=20)
        assert f"step {steps} loss" in log and f"step {steps + 1} loss" not in log, log
    assert run.cancel() is False  # ended: nothing to cancel
    assert slow.wait(timeout_s=120, poll_s=1).state == "CANCELLED"
    with pytest.raises(api.RunError, match=f"{slow.run_dir} has no result: it is CANCELLED"):
        slow.result()
    print(f"api cluster test: {time.monotonic() - t0:.0f} s wall ({t1 - t0:.0f} s to submit all 5)")
