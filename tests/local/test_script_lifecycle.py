"""A foreign program's lifecycle under job=script's task wrapper is exact
(launcher/taskwrap/): its exit code is its own (only the wrapper's stop path
exits 75/76), a stop signal is the task's stop from the wrapper's first line
to its last, the scontrol shim answers only during a stop, the wrapper's own
failure before the program starts is said as the wrapper's, and a quiet
rank's work shows in its heartbeat. The supervisor's side:
tests/unit/test_script_lifecycle_units.py; on Slurm:
tests/cluster/test_script_lifecycle_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from harness import REPO, events, spec_of

from launcher.config.health import heartbeat_path

PROGRAM = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    mode = sys.argv[1]
    stop = []
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    print("started", flush=True)
    if mode in ("75", "76"):  # its own code, as sys.exit(os.EX_TEMPFAIL): no stop under way
        print("RuntimeError: the data server is busy, try again later", flush=True)
        sys.exit(int(mode))
    if mode == "chain":  # trains a slice, asks Slurm for the next one, ends
        print("step 1", flush=True)
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
        sys.exit(0)
    if mode == "wait":
        print("ready", flush=True)
        while not stop:
            time.sleep(0.01)
        sys.exit(0)
    if mode == "ask":  # as Lightning at its stop signal: saves, asks for its requeue, trains on
        print("ready", flush=True)
        while not stop:
            time.sleep(0.01)
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
        time.sleep(60)
    if mode == "quiet":  # a rank that reports no step, still writing its shard
        print("ready", flush=True)
        with open("shard.bin", "wb") as f:
            end = time.time() + float(os.environ["QUIET_WRITE_S"])
            while time.time() < end:
                f.write(b"x" * 4096)
                f.flush()
                time.sleep(0.1)
    """
)


def run_dir_of(tmp_path: Path, mode: str, packed: Path | None = None) -> Path:
    """The run dir (``tmp_path/run``) of PROGRAM ``mode``, in ``packed`` when given."""
    workdir = packed or tmp_path
    prog = workdir / "prog.py"
    prog.write_text(PROGRAM)
    return Path(spec_of(tmp_path, f"job.args=[{mode}]", f"job.workdir={workdir}", script=str(prog)).run_dir)


def spawn(run: Path, tmp_path: Path, **extra_env: str) -> subprocess.Popen[str]:
    """``python -m launcher.taskwrap RUN`` (rank 0 of 1 unless ``extra_env``
    says otherwise), its own process group (a Slurm step's: signalled whole)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MESHRUN_ATTEMPT": "0.0",
        "MESHRUN_NODE_HEARTBEAT_DIR": str(tmp_path / "local"),
        **extra_env,
    }
    env.pop("MESHRUN_LAUNCHER_PID", None)
    return subprocess.Popen(
        [sys.executable, "-m", "launcher.taskwrap", str(run)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wrap(tmp_path: Path, mode: str, *, packed: Path | None = None, **extra_env: str) -> subprocess.Popen[str]:
    """The wrapper of rank 0 of 1 running PROGRAM ``mode``."""
    run = run_dir_of(tmp_path, mode, packed)
    return spawn(run, tmp_path, **({"MESHRUN_PROJECT_DIR": str(packed)} if packed else {}), **extra_env)


def wait_ready(p: subprocess.Popen[str]) -> None:
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("ready"):
            return
    raise AssertionError("the program ended before it was ready")


def fake_slurm(tmp_path: Path) -> dict[str, str]:
    """A job's environment whose real scontrol only logs its calls to ``calls``."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    return {"SLURM_JOB_ID": "42", "PATH": f"{bin_dir}:{os.environ['PATH']}"}


# --- finding 1: a program's exit code is its own ---------------------------
@pytest.mark.parametrize("code", [75, 76])
def test_a_programs_own_stop_code_is_a_counted_failure_with_its_real_code(tmp_path: Path, code: int) -> None:
    """sys.exit(os.EX_TEMPFAIL) with no stop under way: passed through, the
    supervisor and the batch script read it as a stop and requeued it
    forever, never counted against launcher.max_restarts. Now exit 1, and the
    program's own code recorded (failures.log, result.json, program_exit)."""
    p = wrap(tmp_path, str(code), **fake_slurm(tmp_path))
    out, err = p.communicate(timeout=60)
    run = tmp_path / "run"
    assert p.returncode == 1, out + err
    line = (run / "failures.log").read_text().splitlines()[-1]
    assert line.startswith("42 0 rank 0 ") and "RuntimeError: the data server is busy" in line, line
    assert f"program exit {code} (meshrun's stop code, with no stop under way)" in line, line
    result = json.loads((run / "result.json").read_text())
    assert (result["status"], result["error"]) == ("failed", f"exit {code}")
    assert [(e["rc"], e["stopped"]) for e in events(run, "program_exit")] == [(code, False)]


# --- finding 2: a stop is the task's stop from its first line to its last ----
def _catches_usr2(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(int(x.split()[1], 16) for x in text.splitlines() if x.startswith("SigCgt:"))
    return bool(caught & (1 << (signal.SIGUSR2 - 1)))


def test_a_stop_before_the_program_starts_exits_75_at_once_with_nothing_started(tmp_path: Path) -> None:
    """The wrapper loads the spec, builds the environment, copies the run's
    workdir and globs the resume path before it starts the program. Its
    handler was installed after all that: a USR2 meanwhile killed it (srun
    140, the node blamed). Now the handler is the wrapper's first line: a
    stop then is exit 75 at once, no workdir copied, no program started."""
    store = tmp_path / "store" / "abc"
    packed = store / "project"
    for i in range(40):  # a project to copy: the wrapper's slow start
        (packed / f"pkg{i}").mkdir(parents=True)
        for j in range(25):
            (packed / f"pkg{i}" / f"m{j}.py").write_text("x = 1\n")
    (store / "snapshot.json").write_text("{}")  # a code store entry (launcher/taskwrap/workcopy.py)
    p = wrap(tmp_path, "wait", packed=packed)
    t0 = time.monotonic()
    while not _catches_usr2(p.pid) and p.poll() is None and time.monotonic() - t0 < 30:
        time.sleep(0.0005)
    caught_after = time.monotonic() - t0
    copied = (tmp_path / "run" / "workdir").exists()
    p.send_signal(signal.SIGUSR2)
    out, err = p.communicate(timeout=60)
    assert not copied, f"the handler came only after the workdir copy ({caught_after:.2f} s)"
    assert p.returncode == 75, err
    assert "SIGUSR2 before the program started: not starting it (exit 75)" in err, err
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert "started" not in out and not (metrics.exists() and events(tmp_path / "run", "program_start"))
    assert not (tmp_path / "run" / "workdir").exists()


def test_a_stop_signal_as_the_wrapper_exits_changes_its_answer_never(tmp_path: Path) -> None:
    """The supervisor's forwarded USR2 arriving while the wrapper exits after
    a clean stop: Python puts the default action (death) back as it
    finalizes, and the task died of it (srun 140) instead of exiting 75."""
    p = wrap(tmp_path, "wait")
    wait_ready(p)
    p.send_signal(signal.SIGUSR2)
    done = threading.Event()

    def flood() -> None:  # USR2 after USR2 until the wrapper is gone
        while not done.is_set():
            try:
                os.kill(p.pid, signal.SIGUSR2)
            except ProcessLookupError:
                return
            time.sleep(0.0002)

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    out, err = p.communicate(timeout=60)
    done.set()
    t.join(5)
    assert p.returncode == 75, err[-2000:]


# --- finding 3: the scontrol shim answers only during a stop ---------------
def test_a_programs_own_requeue_with_no_stop_reaches_slurm(tmp_path: Path) -> None:
    """A self-chaining program (a slice, then `scontrol requeue $SLURM_JOB_ID`,
    exit 0) got exit 0 from the shim and its job COMPLETED after the first
    slice. With no stop under way the call is Slurm's; a stale stop mark of
    an earlier start changes nothing (the wrapper removes it at its start)."""
    mark = tmp_path / "run" / "progress" / "stopping-rank0"
    mark.parent.mkdir(parents=True)
    mark.touch()
    p = wrap(tmp_path, "chain", **fake_slurm(tmp_path))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    assert (tmp_path / "calls").read_text().splitlines() == ["requeue 42"]
    assert "is not run" not in err and not mark.exists()


def test_at_a_stop_the_programs_requeue_is_answered_and_ends_it(tmp_path: Path) -> None:
    """During a stop (the wrapper's mark, made in its signal handler before
    the program gets the signal) the call is answered: Slurm's scontrol never
    runs, and the wrapper ends the program then (exit 75)."""
    p = wrap(tmp_path, "ask", **fake_slurm(tmp_path), MESHRUN_KILL_WAIT_S="30")
    wait_ready(p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 75, err
    assert "meshrun requeues the job at the stop" in err and not (tmp_path / "calls").exists()


# --- finding 4: the wrapper's own failure is said as the wrapper's ------------
@pytest.mark.parametrize("what", ["spec", "workdir"])
def test_the_wrappers_failure_before_the_program_is_a_wrapper_error(tmp_path: Path, what: str) -> None:
    """A wrapper that died before its program (a bad spec, a workdir copy
    that failed) left no failures.log line, and the supervisor blamed srun's
    first node. Now its line names the cause as the wrapper's (the run's
    error: launcher/selfheal/attribution.py blames no node)."""
    store = tmp_path / "store" / "abc"
    (store / "project").mkdir(parents=True)
    (store / "snapshot.json").write_text("{}")
    run = run_dir_of(tmp_path, "wait", store / "project")
    if what == "spec":
        (run / "spec.json").write_text("{not json")
    else:
        (run / "workdir").write_text("a file where the run's workdir copy goes")
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "0", "WORLD_SIZE": "1", "SLURM_JOB_ID": "42"}
    env.update(MESHRUN_PROJECT_DIR=str(store / "project"), MESHRUN_NODE_HEARTBEAT_DIR=str(tmp_path / "local"))
    env.pop("MESHRUN_LAUNCHER_PID", None)
    done = subprocess.run(
        [sys.executable, "-m", "launcher.taskwrap", str(run)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    line = (run / "failures.log").read_text().splitlines()[-1]
    assert line.startswith("42 0 rank 0 "), line
    assert ": meshrun taskwrap error: " in line and line.endswith("(before the program started)"), line
    assert ("SpecError" if what == "spec" else "NotADirectoryError") in line, line


# --- finding 6: a quiet rank's work shows in its heartbeat -------------------
def test_a_quiet_rank_still_writing_carries_its_activity_in_its_heartbeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank that reports no step keeps its start-up beat's time (its hang
    limits unchanged) and carries ``active``: the time of its newest output
    or write (the teardown rule never ends it while that advances)."""
    monkeypatch.setenv("MESHRUN_NODE_HEARTBEAT_DIR", str(tmp_path / "local"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    p = wrap(tmp_path, "quiet", QUIET_WRITE_S="7")
    wait_ready(p)
    ready_at = time.time()
    beat = json.loads(heartbeat_path(tmp_path / "run", 0).read_text())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and float(beat.get("active") or 0) < ready_at + 3:
        time.sleep(0.2)
        beat = json.loads(heartbeat_path(tmp_path / "run", 0).read_text())
    p.kill()
    p.communicate(timeout=30)
    assert beat["phase"] == "startup" and beat["time"] < ready_at, beat
    # It printed nothing after "ready": the later activity is its writes.
    assert float(beat.get("active") or 0) >= ready_at + 3, beat


def test_a_completed_node_writer_keeps_the_node_file_fresh_while_its_node_peers_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local rank 0's wrapper writes the node's heartbeat file. Its program
    completed first and it exited: the file froze, its node's quiet rank
    (still writing) read as silent, and the teardown rule ended it. Now it
    keeps the file fresh until the node's other ranks have ended, so their
    activity and their end reach the supervisor."""
    from launcher.config.health import read_heartbeats

    monkeypatch.setenv("MESHRUN_NODE_HEARTBEAT_DIR", str(tmp_path / "local"))
    run = run_dir_of(tmp_path, "quiet")
    ranks = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    p0 = spawn(run, tmp_path, RANK="0", LOCAL_RANK="0", QUIET_WRITE_S="0", **ranks)
    p1 = spawn(run, tmp_path, RANK="1", LOCAL_RANK="1", QUIET_WRITE_S="3", **ranks)
    p0.communicate(timeout=60)
    ended0 = time.monotonic()
    p1.communicate(timeout=60)
    ended1 = time.monotonic()
    assert (p0.returncode, p1.returncode) == (0, 0)
    assert ended0 >= ended1 - 1.5, f"rank 0's wrapper left {ended1 - ended0:.1f} s before its node peer"
    beats = read_heartbeats(run)
    assert (beats[0]["phase"], beats[1]["phase"]) == ("done", "done"), beats
