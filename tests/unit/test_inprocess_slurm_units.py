"""The Slurm supervisor's in-process recovery decisions
(launcher/selfheal/inprocess.py) on srun's own lines: which task died and
how, the step's flags (one death ends no step; the store step's output
comes back), and the attempt's exit once its replacements ended."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

from launcher.selfheal.inprocess import (
    InProcessAttempt,
    Replacement,
    dead_tasks,
    kill_on_bad_exit_off,
    without_io,
)

SRUN = ["--unbuffered", "--open-mode=append", "--output", "/j/%j_%t_log.out", "--error", "/j/%j_%t_log.err",
        "--kill-on-bad-exit=1", "--container-image=x"]  # fmt: skip


def test_srun_lines_name_the_dead_task_and_how() -> None:
    assert dead_tasks("srun: error: node2: task 2: Killed") == ("node2", [2], None)
    assert dead_tasks("srun: error: node1: tasks 0-1,3: Exited with exit code 75") == ("node1", [0, 1, 3], 75)
    assert dead_tasks("srun: Job step aborted: Waiting up to 32 seconds") is None


def test_flags_keep_the_step_on_a_death_and_give_back_the_store_line() -> None:
    flags = kill_on_bad_exit_off(SRUN)
    assert "--kill-on-bad-exit=1" not in flags and flags[-1] == "--kill-on-bad-exit=0"
    assert without_io(flags) == ["--unbuffered", "--container-image=x", "--kill-on-bad-exit=0"]


def _attempt(lines: list[str]) -> InProcessAttempt:
    state = SimpleNamespace(
        cfg=SimpleNamespace(
            launcher=SimpleNamespace(max_replacements=1, in_process_collective_timeout_s=5.0)
        ),
        stopping=None,
    )
    a = SimpleNamespace(tag="0.0", srun_errors=[(0.0, x) for x in lines], forwarded=False)
    return InProcessAttempt(state, None, a, 0)  # type: ignore[arg-type]


def _done(code: int) -> subprocess.Popen[str]:
    return subprocess.Popen(["sh", "-c", f"exit {code}"], text=True)


def test_the_attempt_exits_as_its_ranks_last_processes() -> None:
    # Rank 2 killed and replaced, the replacement completed: srun's 137 is not the run's.
    ip = _attempt(["srun: error: node2: task 2: Killed"])
    ip.current[2] = Replacement(2, "node3", _done(0))
    ip.watch(replace=False)
    assert ip.exit_code(137) == 0
    # The replacement failed too: the attempt failed (the restart path follows).
    ip = _attempt(["srun: error: node2: task 2: Killed"])
    ip.current[2] = Replacement(2, "node3", _done(1))
    ip.watch(replace=False)
    assert ip.exit_code(137) == 1
    # Another rank stopped for a requeue after the recovery: the requeue's code.
    ip = _attempt(
        ["srun: error: node2: task 2: Killed", "srun: error: node1: task 0: Exited with exit code 75"]
    )
    ip.current[2] = Replacement(2, "node3", _done(75))
    ip.watch(replace=False)
    assert ip.exit_code(137) == 75
    # No replacement started: srun's own exit.
    assert _attempt([]).exit_code(3) == 3


def test_no_replacement_left_gives_up() -> None:
    ip = _attempt(["srun: error: node2: task 2: Killed"])
    ip.left = 0
    ip.give_up = lambda why: setattr(ip, "gave_up", why)  # type: ignore[method-assign]
    ip.watch()
    assert "no replacement left (launcher.max_replacements)" in ip.gave_up
    assert ip.exit_code(137) == 137


def test_a_hung_rank_is_killed_on_its_node_and_a_starting_replacement_left_be(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json
    import time

    from launcher.selfheal import inprocess

    now = time.time()
    beats = {
        "node1": {0: ("step", 4242, now), 1: ("step", 4343, now)},
        "node2": {3: ("step", 5151, now)},
        "node3": {2: ("startup", 6161, now)},  # rank 2's replacement, not trained yet
    }
    (tmp_path / "heartbeats").mkdir()
    for node, ranks in beats.items():
        doc = {"ranks": {str(r): {"rank": r, "node": node, "pid": pid, "attempt": "0.0", "phase": ph, "time": t,
                                  "step": 9} for r, (ph, pid, t) in ranks.items()}}  # fmt: skip
        (tmp_path / "heartbeats" / f"node-{node}.json").write_text(json.dumps(doc))
    sleeper = subprocess.Popen(["sleep", "30"], text=True)
    started: list[list[str]] = []
    monkeypatch.setattr(inprocess.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or sleeper)
    ip = _attempt([])
    ip.state.run_dir = str(tmp_path)
    ip.n = 0
    ip.a.nodes = ["node1", "node2"]
    ip.launcher = SimpleNamespace(srun=["srun", "x"], env=lambda *a: {})
    ip.current[2] = Replacement(2, "node3", sleeper, started=now - 1)
    ip.current[0] = Replacement(0, "node1", sleeper, started=now - 1)  # trained: this fault's own
    ip.current[1] = Replacement(1, "node1", sleeper, started=now - 60)  # an earlier fault's, hung now
    noted: list[tuple[int, int]] = []
    ip.store = SimpleNamespace(channel=SimpleNamespace(note_hung=lambda g, r: noted.append((g, r))))
    ip.incarnations = {0: 1, 1: 1, 2: 1}
    try:
        # (rank, the incarnation the store host named): hung; the dead process rank 2's replacement
        # is starting for; that replacement (not trained yet); this fault's own (trained); an older
        # one hung; no heartbeat at all; a rank none of whose processes was in the broken
        # generation; a process older than the rank's newest.
        for rank, inc in ((3, 0), (2, 0), (2, 1), (0, 1), (1, 1), (5, 0), (3, None), (1, 0)):
            ip._kill_hung(rank, 1, inc)
    finally:
        sleeper.kill()
        monkeypatch.undo()  # the real Popen again
    assert [k.rank for k in ip.kills] == [3, 1] and noted == []  # hung once the kill found it alive
    ip.kills = ip.kills[:1]
    assert started[0][:7] == ["srun", "--overlap", "--nodelist=node2", "--nodes=1", "--ntasks=1",
                              "--ntasks-per-node=1", "--kill-on-bad-exit=0"]  # fmt: skip
    # The kill command on its own: the pid an argument; alive -> killed (0), gone -> 3.
    cmd = started[0][7:]
    assert cmd[:2] == ["sh", "-c"] and cmd[-2:] == ["meshrun-kill", "5151"]
    victim = subprocess.Popen(["sleep", "30"])
    assert subprocess.run([*cmd[:-1], str(victim.pid)]).returncode == inprocess.KILLED
    victim.wait()
    assert subprocess.run([*cmd[:-1], str(victim.pid)]).returncode == inprocess.GONE
    # The step's end: killed a live process -> the store says rank_hung; gone already -> a death.
    ip.kills[0].proc = _done(inprocess.KILLED)
    ip.kills[0].proc.wait()
    monkeypatch.setattr(inprocess, "say", lambda line: None)
    ip._check_kills()
    assert noted == [(1, 3)] and ip.kills == []
    ip.kills.append(inprocess.Kill(3, 2, 5151, "node2", _done(inprocess.GONE)))
    ip.kills[0].proc.wait()
    ip._check_kills()
    assert noted == [(1, 3)] and ip.kills == []


def test_a_spare_assignment_is_the_rank_and_its_files_checked() -> None:
    import pytest

    from launcher.config.warmspare import assignment, read_assignment

    line = assignment(5, 8, 4, 2, {"stdout": "/r/slurm/7_5_log.out"})
    assert line.endswith("\n")
    env, outputs = read_assignment(line)
    assert env == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MESHRUN_REPLACEMENT": "2",
    }
    assert outputs == {"stdout": "/r/slurm/7_5_log.out"}
    ok = '"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MESHRUN_REPLACEMENT": "1"'
    for bad in ('{"RANK": "9", "WORLD_SIZE": "8", "GROUP_RANK": "2", ' + ok + '}',
                '{"RANK": "1;x", "WORLD_SIZE": "8", "GROUP_RANK": "0", ' + ok + '}',
                '{"RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "0", "stdout": "rel/out", ' + ok + '}',
                '{"RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "0", ' + ok.replace('"1"', '"0"') + '}',
                '{"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0"}',
                '{"RANK": "1", "PATH": "/tmp"}'):  # fmt: skip
        with pytest.raises(ValueError, match="spare"):
            read_assignment(bad)


def test_a_replacement_bound_for_a_warm_spares_node_is_that_spare(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from launcher.selfheal import inprocess

    spare = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ip = _attempt(["srun: error: node2: task 2: Killed"])
    ip.state.job, ip.state.plan = "77", SimpleNamespace(world_size=4)
    ip.launcher = SimpleNamespace(srun=["srun", *SRUN, "py", "-u", "-m", "train", "/r"], rpn=2)
    ip.spares["node3"] = spare
    monkeypatch.setattr(inprocess, "healthy_nodes", lambda state: ["node1", "node2", "node3"])
    ip.a.nodes = ["node1", "node2"]
    ip.watch()
    assert ip.current[2].proc is spare and ip.current[2].node == "node3" and not ip.spares
    spare.stdin.close()  # type: ignore[union-attr]
    got = spare.stdout.read()  # type: ignore[union-attr]
    spare.wait()
    from launcher.config.warmspare import read_assignment

    env, outputs = read_assignment(got)
    assert env["RANK"] == "2" and env["LOCAL_RANK"] == "0" and env["GROUP_RANK"] == "1"
    assert env["MESHRUN_REPLACEMENT"] == "1"  # rank 2's first replacement
    assert outputs == {"stdout": "/j/77_2_log.out", "stderr": "/j/77_2_log.err"}
    # Its successor: on the node the lost task left, once the rank the spare took has trained.
    assert ip.refill == ("node2", 2)
    started: list[str] = []
    beat: dict[int, dict] = {}
    monkeypatch.setattr(ip, "_start_spare", started.append)
    monkeypatch.setattr(inprocess, "say", lambda line: None)
    monkeypatch.setattr(inprocess, "read_heartbeats", lambda run_dir: beat)
    ip.state.run_dir = "/nonexistent"
    ip.current[2] = Replacement(2, "node3", subprocess.Popen(["sleep", "30"], text=True), started=100.0)
    try:
        ip._refill()  # no beat yet
        beat[2] = {"phase": "restore", "time": 101.0}
        ip._refill()  # restoring
        assert started == []
        beat[2] = {"phase": "warmup", "time": 102.0}
        ip._refill()  # its first step, the recovery's, runs
        assert started == []
        beat[2] = {"phase": "step", "time": 103.0}
        ip._refill()
        ip._refill()
        assert started == ["node2"] and ip.refill is None
        # A node no longer healthy (excluded, out of the allocation) gets none.
        monkeypatch.setattr(inprocess, "healthy_nodes", lambda state: ["node1", "node3"])
        ip.refill = ("node2", 2)
        ip._refill()
        assert started == ["node2"] and ip.refill is None
    finally:
        ip.current[2].proc.kill()


def test_a_kill_step_that_failed_is_said_tried_again_then_ends_the_attempt(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from launcher.selfheal import inprocess

    said: list[str] = []
    monkeypatch.setattr(inprocess, "say", said.append)
    monkeypatch.setattr(inprocess, "read_heartbeats", lambda run_dir: {})
    monkeypatch.setattr(inprocess, "slurm_cmd", lambda cmd: None)
    ip = _attempt([])
    ip.state.run_dir = "/nonexistent"
    ip.launcher = SimpleNamespace(srun=["srun", "x"], env=lambda *a: {})
    tries: list[int] = []

    def kill_step(pid: int, node: str) -> subprocess.Popen[bytes]:
        tries.append(pid)
        return _done(1)  # srun could not create the step

    monkeypatch.setattr(ip, "_kill_step", kill_step)
    ip.kills.append(inprocess.Kill(3, 1, 5151, "node2", kill_step(5151, "node2")))
    for _ in range(inprocess.KILL_TRIES):
        for k in ip.kills:
            k.proc.wait()
        ip._check_kills()
    assert tries == [5151] * inprocess.KILL_TRIES
    assert sum("the step killing hung rank 3 (pid 5151 on node2) exited 1" in x for x in said) == 3
    assert ip.gave_up == "hung rank 3 (pid 5151 on node2) could not be killed"
    assert not ip.kills


def test_a_kill_that_found_the_rank_replaced_already_is_no_failure(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from launcher.selfheal import inprocess

    said: list[str] = []
    monkeypatch.setattr(inprocess, "say", said.append)
    ip = _attempt([])
    k = inprocess.Kill(3, 1, 5151, "node2", _done(1), issued=100.0)
    k.proc.wait()
    ip.kills.append(k)
    ip.current[3] = Replacement(3, "node2", _done(0), started=101.0)  # srun's word of its death came first
    ip._check_kills()
    assert not ip.kills and not said and not ip.gave_up
