"""goodput.json without ``meshrun fleet``: the batch script's teardown
(launcher/views/goodputend.py) finalises it at the job's end, and ``meshrun
status`` refreshes it and shows ETTR (recorded sacct lines; no Slurm needed;
the real job's end is checked in tests/cluster/test_fleet_cluster.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from launcher.slurm import cluster
from launcher.views import goodput as gp
from launcher.views import goodputend
from launcher.views import runstate as status

# sacct -n -P -X -D --format=<ACCOUNTING_FIELDS> inside job 41's allocation:
# Slurm has not recorded its end yet.
RUNNING_41 = "41|tiny|RUNNING|1000|1010|Unknown|1|node1|billing=2,cpu=2,gres/gpu=2,mem=1G,node=1|" \
    "cpu=2,gres/gpu=2|0:0|None|debug|research|alice|research\n"  # fmt: skip


def fake_sacct(monkeypatch: pytest.MonkeyPatch, out: str, calls: list[list[str]]) -> None:
    def run(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, out, "")

    monkeypatch.setattr(cluster, "run", run)


def metrics(run_dir: Path) -> None:
    recs = [
        {"step": n, "loss": 1.0, "step_time_s": 1.0, "tokens_per_s": 5.0, "time": 1020.0 + n}
        for n in range(1, 11)
    ]
    (run_dir / gp.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.mark.parametrize(
    ("rc", "state", "final"), [(0, "COMPLETED", True), (75, "PREEMPTED", False), (1, "FAILED", True)]
)
def test_batch_end_writes_goodput_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rc: int, state: str, final: bool
) -> None:
    metrics(tmp_path)
    calls: list[list[str]] = []
    fake_sacct(monkeypatch, RUNNING_41, calls)
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    monkeypatch.setattr(goodputend.time, "time", lambda: 1040.0)
    assert goodputend.main([str(tmp_path), str(rc)]) == 0
    g = json.loads((tmp_path / gp.GOODPUT_FILE).read_text())
    assert len(calls) == 1 and calls[0][0] == "sacct" and "41" in calls[0]
    assert g["final"] is final and g["state"] == state and g["job_id"] == "41"
    assert g["finalised_by"] == ("batch script" if final else None)
    # The allocation ends now (1040): 30 s on 2 GPUs, every second in a bucket.
    assert g["allocated_gpu_s"] == 60 and sum(g["buckets_gpu_s"].values()) == pytest.approx(60)
    assert g["buckets_s"]["productive"] == pytest.approx(10) and g["ettr"] == pytest.approx(10 / 30)
    tail = "idle_end" if rc == 0 else "hang_restart"
    assert g["buckets_s"][tail] == pytest.approx(1040 - 1030)


def test_batch_end_says_why_nothing_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_sacct(monkeypatch, "", [])
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert goodputend.main([str(tmp_path), "0"]) == 0  # never fails the job
    assert "not written at the job's end: sacct knows no job 42" in capsys.readouterr().err
    assert not (tmp_path / gp.GOODPUT_FILE).exists()
    assert goodputend.main([str(tmp_path), "x"]) == 2


def test_array_task_job_id() -> None:
    env = {"SLURM_JOB_ID": "51", "SLURM_ARRAY_JOB_ID": "50", "SLURM_ARRAY_TASK_ID": "1"}
    assert goodputend.job_id_from_env(env) == "50_1"
    assert goodputend.job_id_from_env({"SLURM_JOB_ID": "9"}) == "9"
    assert goodputend.job_id_from_env({}) is None


def test_status_refreshes_goodput_and_shows_ettr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    (run / "slurm").mkdir(parents=True)
    (run / "spec.json").write_text("{}")
    (run / "slurm" / "job.json").write_text('{"job_id": "41"}')
    metrics(run)
    calls: list[list[str]] = []
    fake_sacct(monkeypatch, RUNNING_41, calls)
    rec = cluster.JobRecord("41", "tiny", "RUNNING", "00:00:20", "1", "node1", "0:0", 0)
    monkeypatch.setattr(status, "jobs", lambda ids, login="": {"41": rec})
    monkeypatch.setattr(goodputend.time, "time", lambda: 1030.0)
    text = status.format_table(status.table(run))
    head, row = (line.split() for line in text.splitlines()[:2])
    assert head[head.index("ETTR")] == "ETTR"
    assert row[head.index("ETTR")] == "50.0%~"  # 10 productive of 20 allocated seconds, not final
    g = json.loads((run / gp.GOODPUT_FILE).read_text())
    assert g["final"] is False and g["allocated_gpu_s"] == 40 and len(calls) == 1
    # A final one (the batch script's) is read back, not recomputed.
    ended = RUNNING_41.replace("RUNNING|1000|1010|Unknown", "COMPLETED|1000|1010|1040")
    fake_sacct(monkeypatch, ended, calls)
    gp.write(run, {**g, "final": True, "ettr": 0.25})
    rec.state = "COMPLETED"
    text = status.format_table(status.table(run))
    assert text.splitlines()[1].split()[head.index("ETTR")] == "25.0%"


def test_supervisor_keeps_goodput_fresh_while_the_job_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """goodputend.keep_fresh (started by the batch-level supervisor) rewrites
    goodput.json from sacct at each interval while the job runs; a failing
    sacct is said once, and the next interval tries again."""
    import time

    metrics(tmp_path)
    calls: list[list[str]] = []
    fake_sacct(monkeypatch, RUNNING_41, calls)
    stop = goodputend.keep_fresh(str(tmp_path), "41", every_s=0.05)
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / gp.GOODPUT_FILE).exists():
            assert time.monotonic() < deadline, "goodput.json never written"
            time.sleep(0.02)
        g = gp.read(tmp_path)
        assert g["job_id"] == "41" and g["final"] is False and g["steps"]["reached"] == 10, g

        def failing(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
            calls.append(args)
            raise cluster.SlurmError("sacct: slurmdbd not responding")

        monkeypatch.setattr(cluster, "run", failing)
        n = len(calls)
        while len(calls) < n + 3:  # it keeps trying
            assert time.monotonic() < deadline, "no retry after a failed refresh"
            time.sleep(0.02)
    finally:
        stop.set()
    err = capsys.readouterr().err
    assert err.count("goodput.json not refreshed: sacct: slurmdbd not responding") == 1, err
