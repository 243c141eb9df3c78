"""Which task of a job=script run reports the program's progress and result
(launcher/taskwrap/workers.py): the one hosting the program's global RANK
0, under job.launch=torchrun on whichever node the rendezvous put it. The
two wrappers with real processes: tests/local/test_script_torchrun_rank0.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from harness import spec_of

from launcher.config.scriptjob import read_workers, workers_path
from launcher.taskwrap import workers as wk
from launcher.taskwrap.report import Report
from launcher.taskwrap.taskenv import Ranks

NODE1 = Ranks(2, 0, 4, 2, 1, [2, 3])  # the second node's torchrun task (Slurm's order): logs/rank2.log
NODE0 = Ranks(0, 0, 4, 2, 0, [0, 1])


def test_a_tasks_run_reports_from_task_0_and_never_reads_proc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wk, "worker_ranks", lambda agent: pytest.fail("read /proc"))
    for rank, main in ((0, True), (1, False)):
        w = wk.Workers(tmp_path, Ranks(rank, rank, 2, 2, 0, [rank]), False, {})
        w.start(123)
        assert w.main() is main
    assert not read_workers(tmp_path)


def test_torchruns_rank_0_on_the_second_node_is_reported_there_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "progress").mkdir()
    seen = {"1": [0], "2": [0, 1]}  # torchrun starting its workers: one seen, then both
    env = {"SLURM_PROCID": "1", "SLURM_JOB_ID": "7", "MESHRUN_ATTEMPT": "0.0", "SLURMD_NODENAME": "n2"}
    w = wk.Workers(tmp_path, NODE1, True, env)
    monkeypatch.setattr(wk, "worker_ranks", lambda agent: seen[str(agent)])
    w.start(1)
    assert w.main() is False and w.ranks is None  # a partial set is not believed
    w.agent = 2
    assert w.main() is True and w.ranks == [0, 1]
    doc = json.loads(workers_path(tmp_path, 2).read_text())
    assert {k: doc[k] for k in ("ranks", "log_rank", "task", "node", "host", "job", "attempt")} == {
        "ranks": [0, 1], "log_rank": 2, "task": 1, "node": 1, "host": "n2", "job": "7", "attempt": "0.0"
    }  # fmt: skip
    # The first node's task learns it does not host rank 0: it writes no result.
    first = wk.Workers(tmp_path, NODE0, True, {**env, "SLURM_PROCID": "0"})
    monkeypatch.setattr(wk, "worker_ranks", lambda agent: [2, 3])
    first.start(3)
    report = Report(tmp_path, 0, env, main=first.main)
    report.result("completed", 0, None)
    assert not (tmp_path / "result.json").exists()
    assert {r: d["log_rank"] for r, d in read_workers(tmp_path).items()} == {0: 2, 1: 2, 2: 0, 3: 0}


def test_workers_never_seen_leave_it_to_the_first_node_unless_another_claimed_rank_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "progress").mkdir()
    monkeypatch.setattr(wk, "worker_ranks", lambda agent: [])  # ended before a look, /proc unreadable
    env = {"SLURM_JOB_ID": "7", "MESHRUN_ATTEMPT": "0.1"}
    first = wk.Workers(tmp_path, NODE0, True, env)
    first.start(1)
    assert first.main() is True  # the old rule: the first node's task
    assert wk.Workers(tmp_path, NODE1, True, env).main() is False
    # A record of an earlier start names rank 0 elsewhere: still the first node's.
    old = {"ranks": [0, 1], "log_rank": 2, "task": 1, "job": "7", "attempt": "0.0", "time": time.time()}
    workers_path(tmp_path, 2).write_text(json.dumps(old))
    first.next_read = 0.0
    assert first.main() is True
    # This start's: the other task reports.
    workers_path(tmp_path, 2).write_text(json.dumps({**old, "attempt": "0.1"}))
    first.next_read = 0.0
    assert first.main() is False


def test_the_newest_record_of_a_rank_wins(tmp_path: Path) -> None:
    """A shrink left fewer nodes: an older start's record of rank 0 loses to this one's."""
    (tmp_path / "progress").mkdir()
    workers_path(tmp_path, 2).write_text(json.dumps({"ranks": [0, 1], "log_rank": 2, "time": 100.0}))
    workers_path(tmp_path, 0).write_text(json.dumps({"ranks": [0, 1], "log_rank": 0, "time": 200.0}))
    (tmp_path / "progress" / "workers-rank4.json").write_text('{"ranks": [')  # being written
    assert {r: d["log_rank"] for r, d in read_workers(tmp_path).items()} == {0: 0, 1: 0}
    assert read_workers(tmp_path / "none") == {}


def test_a_workers_rank_is_read_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """RANK as torchrun set it in each worker (/proc/<pid>/environ), beside
    its run id; a process above them with the task's RANK (a local run's
    torchrun, an interpreter shim) is not a worker."""
    me = os.getpid()
    assert wk.process_tree(me)[0] == me
    assert wk.environ(me).get("PATH") == os.environ.get("PATH")
    assert wk.environ(1 << 30) == {}
    run = {"TORCHELASTIC_RUN_ID": "7"}
    envs = {
        10: {"RANK": "0", "LOCAL_RANK": "0"},  # the agent, with a local run's task RANK
        11: {"RANK": "3", "LOCAL_RANK": "1", **run},  # a worker
        12: {"RANK": "3", "LOCAL_RANK": "1", **run},  # its DataLoader's worker
        13: {"RANK": "2", **run},
        14: {"RANK": "x", "LOCAL_RANK": "0", **run},
    }
    monkeypatch.setattr(wk, "process_tree", lambda pid: [pid, 11, 12, 13, 14, 15])
    monkeypatch.setattr(wk, "environ", lambda pid: envs.get(pid, {}))
    assert wk.worker_ranks(10) == [3]


def test_a_torchrun_task_starts_from_slurms_node_order(tmp_path: Path) -> None:
    """The Ranks a torchrun task starts from: Slurm's node order, before its workers are seen."""
    from launcher.taskwrap.taskenv import task_ranks

    spec = spec_of(
        tmp_path, "job.launch=torchrun", "cluster=testcluster", "cluster.nodes=2", "cluster.gpus_per_node=2"
    )
    assert task_ranks({"SLURM_NODEID": "1"}, spec) == NODE1


# --- meshrun status logs: any rank's output, wherever torchrun put it -------
def _torchrun_run(tmp_path: Path) -> Path:
    """A 2-node torchrun run whose rendezvous put ranks 0-1 on the second
    node (Slurm task 1, the wrapper's logs/rank2.log), job 7 of Slurm."""
    spec = spec_of(
        tmp_path, "job.launch=torchrun", "cluster=testcluster", "cluster.nodes=2", "cluster.gpus_per_node=2"
    )
    run = Path(spec.run_dir)
    (run / "slurm").mkdir(exist_ok=True)
    (run / "slurm" / "job.json").write_text(json.dumps({"job_id": "7"}))
    (run / "progress").mkdir(exist_ok=True)
    for task, ranks in ((0, [2, 3]), (1, [0, 1])):
        (run / "slurm" / f"7_{task}_log.out").write_text(f"node {task}: ranks {ranks}\n")
        doc = {"ranks": ranks, "log_rank": 2 * task, "task": task, "node": task, "time": time.time()}
        workers_path(run, 2 * task).write_text(json.dumps(doc))
    return run


def test_status_logs_shows_the_rank_asked_for_from_the_node_that_hosts_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from launcher.commands import status

    run = _torchrun_run(tmp_path)
    assert status.main(["logs", str(run)]) == 0  # rank 0 by default: the second node's
    out = capsys.readouterr().out
    assert "job 7, rank 0 of 4 (node 1's torchrun: ranks 0-1) (--rank N, --rank all: the others)" in out
    assert f"{run / 'slurm' / '7_1_log.out'}\nnode 1: ranks [0, 1]\n" in out and "node 0" not in out
    assert status.main(["logs", str(run), "--rank", "3"]) == 0
    assert "node 0: ranks [2, 3]" in capsys.readouterr().out
    assert status.main(["logs", str(run), "--rank", "all"]) == 0
    out = capsys.readouterr().out
    heads = [line for line in out.splitlines() if line.startswith("==> ")]
    assert [h.split(", ", 1)[1].split(":")[0] for h in heads] == [
        "ranks 0-1 of 4 (node 1's torchrun)",
        "ranks 2-3 of 4 (node 0's torchrun)",
    ]


@pytest.mark.parametrize(
    ("rank", "words"),
    [
        ("4", "--rank 4: run-x has ranks 0-3 (give one of them, or --rank all)"),
        ("-1", "--rank -1: run-x has ranks 0-3"),
        ("first", "--rank 'first' is not a rank: give a rank number (0, 1, ...) or all"),
    ],
)
def test_status_logs_refuses_a_rank_the_run_does_not_have(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rank: str, words: str
) -> None:
    from launcher.commands import status

    run = _torchrun_run(tmp_path)
    (run / "run_id").write_text("run-x\n")
    with pytest.raises(SystemExit) as e:
        status.main(["logs", str(run), "--rank", rank])
    err = capsys.readouterr()
    assert e.value.code == 2 and words in err.err and "==>" not in err.out


def test_logs_of_a_run_of_one_task_per_rank_and_before_torchrun_s_record(tmp_path: Path) -> None:
    """One task per rank (the trainer, job.launch=tasks): the rank's own
    file. A torchrun run whose workers were not seen yet: Slurm's node order."""
    from launcher.api import Run
    from launcher.views.ranklogs import every_rank_log, rank_log

    tasks = Path(spec_of(tmp_path / "a", "cluster=testcluster", "cluster.gpus_per_node=2").run_dir)
    (tasks / "logs").mkdir()
    (tasks / "logs" / "rank1.log").write_text("one\n")
    assert rank_log(tasks, None, 1).path == tasks / "logs" / "rank1.log"
    assert rank_log(tasks, None, 0).path is None  # no output yet
    assert [rl.ranks for rl in every_rank_log(tasks, None)] == [[0], [1]]
    run = _torchrun_run(tmp_path / "b")
    for f in (run / "progress").glob("workers-*"):
        f.unlink()
    guess = rank_log(run, "7", 0)
    assert (guess.path, guess.ranks, guess.node) == (run / "slurm" / "7_0_log.out", [0, 1], 0)
    # The API's handle reads the same file.
    assert Run(run_dir=str(tasks), job_id=None).logs(rank=1) == "one\n"
