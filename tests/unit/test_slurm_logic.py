"""Unit tests of the Slurm helpers that need no cluster: admin rendering,
time parsing, sacct parsing, status table, signal flag.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_slurm_units.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from launcher.slurm import cluster as slurm
from launcher.slurm import qospresets as qos_admin
from launcher.views import runstate as status


def test_partition_lines_from_presets() -> None:
    lines = qos_admin.partition_lines(qos_admin.load_presets(), "node[1-4]")
    by_name = {line.split()[0]: line for line in lines}
    assert set(by_name) == {"PartitionName=research", "PartitionName=training", "PartitionName=inference"}
    assert "MaxTime=4320" in by_name["PartitionName=training"]
    assert "Default=YES" in by_name["PartitionName=research"]
    assert "AllowQos=inference" in by_name["PartitionName=inference"]


def test_sacctmgr_shares_priorities_preemption() -> None:
    cmds = qos_admin.sacctmgr_commands(qos_admin.load_presets(), total_gpus=32, user="alice")
    text = "\n".join(cmds)
    assert "modify qos research set Priority=10 GrpTRES=gres/gpu=12 " in text  # 40% of 32
    assert "modify qos training set Priority=50 GrpTRES=gres/gpu=16 " in text  # 50%
    assert "GrpTRES=gres/gpu=3 " in text  # inference: 10%
    training = next(c for c in cmds if "modify qos training" in c)
    assert "Preempt=research" in training and "GraceTime=300" in training
    research = next(c for c in cmds if "modify qos research" in c)
    assert "Preempt=" not in research  # nobody is preempted by research
    assert "sacctmgr -i add user alice Account=training" in cmds


def test_stop_budget_fits_the_window_before_the_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a signal the end-of-run waits get the window to Slurm's kill
    minus the margin, minus what already passed: USR2 min(lead, grace),
    SIGTERM min(grace, KillWait)."""
    from train.loop import signals as sig

    monkeypatch.setenv("MESHRUN_KILL_WAIT_S", "30")
    flag = sig.PreemptFlag()
    assert sig.stop_budget_s(flag, 120, 300) is None  # no signal: the normal end
    flag.set(signal.SIGUSR2)
    assert 109 < sig.stop_budget_s(flag, 120, 300) <= 110  # time limit: lead 120 - 10
    flag = sig.PreemptFlag()
    flag.set(signal.SIGTERM)
    assert 22 < sig.stop_budget_s(flag, 120, 300) <= 22.5  # KillWait 30 - 7.5
    flag.at -= 100  # the save already took longer than the window
    assert sig.stop_budget_s(flag, 120, 300) == 0.0


def test_minutes_and_gpu_tres() -> None:
    assert slurm._minutes("1-00:00:00") == 1440
    assert slurm._minutes("04:00:00") == 240
    assert slurm._minutes("30:00") == 30
    assert slurm._minutes("UNLIMITED") is None
    assert slurm._tres("cpu=4,gres/gpu=12", "gres/gpu") == 12
    assert slurm._tres("cpu=4,gres/gpu=12,node=3", "node") == 3
    assert slurm._tres("gres/gpu:h100=2", "gres/gpu") is None  # a typed GPU count is another TRES
    assert slurm._tres("", "gres/gpu") is None
    assert slurm.node_gpus({"Gres": "gpu:8"}) == 8
    assert slurm.node_gpus({"Gres": "gpu:h100:4(S:0-1)"}) == 4


def test_jobs_counts_requeues(monkeypatch: pytest.MonkeyPatch) -> None:
    out = "12|meshrun|PREEMPTED|00:00:30|1|node1|0:0\n12|meshrun|COMPLETED|00:01:00|1|node1|0:0\n13_0|m|CANCELLED by 0|00:00:05|2|node[1-2]|0:15\n"
    out += "14|my run | a|b|RUNNING|00:00:05|1|node1|0:0\n"  # a free-text job name with '|'

    def fake_run(args, **kw):
        assert args[0] == "sacct" and "-D" in args
        return subprocess.CompletedProcess(args, 0, out, "")

    monkeypatch.setattr(slurm, "run", fake_run)
    recs = slurm.jobs(["12", "13_0", "14"])
    assert recs["14"].name == "my run | a|b" and recs["14"].state == "RUNNING" and recs["14"].nodes == "1"
    assert recs["12"].state == "COMPLETED" and recs["12"].restarts == 1
    assert recs["13_0"].state == "CANCELLED" and recs["13_0"].restarts == 0


def test_no_slurm_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(slurm.SlurmUnavailable, match="no Slurm reachable"):
        slurm.run(["sacct"])


def test_status_table_from_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "0"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 5, "loss": 2.5}) + "\n" + json.dumps({"event": "resume", "step": 5}) + "\n"
        + json.dumps({"step": 10, "loss": 2.25}) + "\n"
    )  # fmt: skip
    manifest = {
        "points": [{"point": 0, "run_dir": str(run), "job_id": "7_0"}, {"point": 1, "status": "invalid"}]
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    acct = {"JobID": "7_0", "State": "RUNNING", "Submit": "900", "Start": "1000", "End": "Unknown", "NNodes": "1"}  # fmt: skip
    monkeypatch.setattr(
        status, "accounting", lambda ids, login="": [acct] if ids == ["7_0"] and not login else []
    )
    text = status.format_table(status.table(tmp_path, now=1060.0))
    head, row = (line.split() for line in text.splitlines()[:2])
    got = {h: row[head.index(h)] for h in ("RUN", "JOB", "STATE", "ELAPSED", "NODES", "STEP", "LOSS")}
    assert got == {"RUN": "0", "JOB": "7_0", "STATE": "RUNNING", "ELAPSED": "00:01:00", "NODES": "1",
                   "STEP": "10", "LOSS": "2.2500"}  # fmt: skip


def test_signal_handler_only_sets_flag() -> None:
    from train.loop import signals

    old = signal.getsignal(signal.SIGUSR2)
    try:
        flag = signals.install()
        assert not flag.is_set()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.is_set() and flag.reason == "SIGUSR2"
        assert flag.agreed()  # no process group: the local flag
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_accounting_keeps_a_job_name_with_pipes(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = slurm.ACCOUNTING_FIELDS
    values = {f: f.lower() for f in fields} | {"JobID": "7", "JobName": "a | b|c", "State": "RUNNING"}
    line = "|".join(values[f] for f in fields)
    monkeypatch.setattr(
        slurm, "run", lambda args, **kw: subprocess.CompletedProcess(args, 0, line + "\n", "")
    )
    (row,) = slurm.accounting(["7"])
    assert row == values
