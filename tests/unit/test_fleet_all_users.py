"""``meshrun fleet --all-users``: every meshrun job Slurm knows, from one
``sacct -a`` and one ``squeue -a`` (recorded answers here; one real call
on the test cluster: tests/cluster/test_fleet_all_users_cluster.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher.slurm import cluster
from launcher.views import fleetall, fleettext

S = cluster.UNIT_SEP
# sacct -a -n -P -X -D --delimiter=<US> --format=<ALL_USERS_FIELDS> (recorded
# on the test cluster, one job per kind): bob's meshrun run requeued once
# (two lines), carol's pending one (comment stored), a plain job.
SACCT = "\n".join(
    S.join(f)
    for f in [
        ["201", "tiny-a|b", "REQUEUED", "1000", "1010", "1110", "1", "node1", "cpu=2,gres/gpu=2,node=1", "gres/gpu=2",
         "0:0", "None", "research", "research", "bob", "research", "",
         "sbatch /home/bob/runs/tiny/slurm/.submission_file_0a1b2c.sh"],
        ["201", "tiny-a|b", "RUNNING", "1110", "1200", "Unknown", "1", "node2", "cpu=2,gres/gpu=2,node=1", "gres/gpu=2",
         "0:0", "None", "research", "research", "bob", "research", "",
         "sbatch /home/bob/runs/tiny/slurm/.submission_file_0a1b2c.sh"],
        ["202", "big", "PENDING", "1150", "Unknown", "Unknown", "4", "None assigned", "", "gres/gpu=32",
         "0:0", "QOSGrpGRES", "training", "training", "carol", "training", "meshrun run_dir=/scratch/carol/big", ""],
        ["203", "wrap", "COMPLETED", "900", "905", "960", "1", "node3", "cpu=1,node=1", "cpu=1", "0:0", "None",
         "debug", "research", "dave", "research", "", "sbatch --wrap sleep 55"],
    ]
)  # fmt: skip
SQUEUE = "\n".join(
    S.join(f)
    for f in [
        ["201", "RUNNING", "None", "1200", "research", "research", "bob", "tiny-a|b",
         "meshrun run_dir=/home/bob/runs/tiny", "gres:gpu:2"],
        ["202", "PENDING", "QOSGrpGRES", "2000", "training", "training", "carol", "big",
         "meshrun run_dir=/scratch/carol/big", "gres:gpu:8"],
    ]
)  # fmt: skip


def test_all_users_from_recorded_sacct_and_squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def run(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, SACCT if args[0] == "sacct" else SQUEUE, "")

    monkeypatch.setattr(cluster, "run", run)
    sched = fleetall.AllUsersScheduler()
    view = fleetall.collect_all(tmp_path, sched, write=False, now=1300.0)
    assert [c[:2] for c in calls] == [["sacct", "-a"], ["squeue", "-h"]] and view.scheduler_calls == 2
    rows = {r.job_id: r for r in view.others}
    assert sorted(rows) == ["201", "202"]  # the plain --wrap job is not meshrun's
    bob, carol = rows["201"], rows["202"]
    assert (bob.run, bob.user, bob.qos, bob.partition, bob.state, bob.gpus) == (
        "tiny-a|b", "bob", "research", "research", "RUNNING", 2
    )  # fmt: skip
    assert bob.run_dir == "/home/bob/runs/tiny"
    assert bob.gpu_hours == pytest.approx((100 * 2 + 100 * 2) / 3600)  # both starts, the running one to now
    assert (carol.state, carol.reason, carol.expected_start, carol.gpus) == (
        "PENDING",
        "QOSGrpGRES",
        2000.0,
        32,
    )
    per_user = {g["user"]: g for g in view.totals["user"]}
    assert per_user["bob"]["gpu_hours"] == pytest.approx(bob.gpu_hours) and per_user["bob"]["gpus_now"] == 2
    text = fleettext.format_view(view)
    assert "other meshrun jobs Slurm knows" in text and "QOSGrpGRES" in text and "carol" in text
    # Cached: a second refresh within the interval asks Slurm nothing.
    fleetall.collect_all(tmp_path, sched, write=False, now=1301.0)
    assert len(calls) == 2


def test_a_run_under_the_root_is_not_listed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "tiny"
    (run / "slurm").mkdir(parents=True)
    (run / "spec.json").write_text("{}")
    (run / "slurm" / "job.json").write_text('{"job_id": "201"}')
    monkeypatch.setattr(
        cluster,
        "run",
        lambda args, **kw: subprocess.CompletedProcess(args, 0, SACCT if args[0] == "sacct" else SQUEUE, ""),
    )
    view = fleetall.collect_all(tmp_path, fleetall.AllUsersScheduler(), write=False, now=1300.0)
    assert [r.job_id for r in view.runs] == ["201"] and view.runs[0].user == "bob"
    assert [r.job_id for r in view.others] == ["202"]


def test_run_dir_hint() -> None:
    assert fleetall.run_dir_hint("meshrun run_dir=/a b/c", "") == "/a b/c"
    assert fleetall.run_dir_hint("", "sbatch /r/x/slurm/.submission_file_ab12.sh") == "/r/x"
    assert fleetall.run_dir_hint("", "sbatch --wrap sleep 5") is None
    assert fleetall.run_dir_hint("my comment", "") is None
