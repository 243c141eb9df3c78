"""job=script: a team's own program on meshrun's machinery (launcher/plan/script.py,
launcher/taskwrap/wrapper.py, launcher/config/scriptjob.py). No Slurm here; the
cluster test is tests/cluster/test_scriptjob_slurm.py.
Tests that start no process: tests/unit/test_scriptjob_units.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from harness import TOY, launch_toy, script_cfg, spec_of

from launcher.config.health import heartbeat_path, read_heartbeats
from launcher.config.scriptjob import step_record
from launcher.config.spec import RunSpec
from launcher.plan.make import make_plan
from launcher.taskwrap import taskenv
from launcher.taskwrap import wrapper as taskwrap
from launcher.taskwrap.stacks import PY_SPY_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[2]


def test_rendezvous_falls_back_to_the_steps_first_node_and_the_jobs_port() -> None:
    env = {"SLURM_STEP_NODELIST": "gpu-a17", "SLURM_JOB_ID": "123456"}
    assert taskenv.rendezvous(env) == ("gpu-a17", str(20000 + 123456 % 20000))
    assert taskenv.rendezvous({}) == ("127.0.0.1", "29500")


# --- the wrapper around a real program (no torch) ------------------------
PROGRAM = textwrap.dedent(
    """
    import json, os, signal, sys, time
    mode = sys.argv[1]
    stop = []
    if mode == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    print("cwd", os.getcwd(), "rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)
    if mode == "silent":  # resumed at its end: trains nothing, prints no step
        sys.exit(0)
    if mode == "bar":  # tqdm's bar as the HF Trainer draws it: redrawn after carriage returns
        for n in range(4):
            sys.stdout.write(f"\\r{100 * n // 3:3d}%|{'#' * n:<3}| {n}/3 [00:0{n}<00:03,  1.00it/s]")
            sys.stdout.flush()
            time.sleep(0.05)
        print(flush=True)
        sys.exit(0)
    for step in range(1, 4):
        print(f"step {step} loss {1.0 / step:.3f}", flush=True)
        time.sleep(0.05)
    with open(os.environ["MESHRUN_PROGRESS_FILE"], "w") as f:
        json.dump({"step": 7, "loss": 0.125}, f)
    time.sleep(0.6)  # the progress file is polled
    if mode == "fail":
        raise ValueError("boom at step 7")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "wait":
        print("ready", flush=True)
        while not stop:
            time.sleep(0.05)
        print("got", signal.Signals(stop[0]).name, flush=True)
    if mode == "ignore":
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    if mode == "hang":
        def stuck_in_a_collective():
            print("ready", flush=True)
            while True:
                time.sleep(0.05)
        stuck_in_a_collective()
    if mode == "ask":  # as Lightning on SIGUSR1: save, ask Slurm to requeue, train on
        print("ready", flush=True)
        while not stop:
            time.sleep(0.05)
        import subprocess
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
        while True:
            time.sleep(0.05)
    """
)


def wrap(tmp_path: Path, mode: str, **extra_env: str) -> subprocess.Popen[str]:
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    spec = spec_of(tmp_path, f"job.args=[{mode}]", "job.workdir=" + str(tmp_path), script=str(prog))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MESHRUN_ATTEMPT": "0.0",
        "MESHRUN_NODE_HEARTBEAT_DIR": str(tmp_path / "local"),
        **extra_env,
    }
    env.pop("MESHRUN_LAUNCHER_PID", None)
    return subprocess.Popen(
        [sys.executable, "-m", "launcher.taskwrap", spec.run_dir],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group, as a Slurm step's: signalled whole
    )


def test_program_that_exits_0_completes_with_heartbeats_metrics_log(tmp_path: Path) -> None:
    p = wrap(tmp_path, "ok")
    out, _ = p.communicate(timeout=60)
    run = tmp_path / "run"
    assert p.returncode == 0, out
    assert f"cwd {tmp_path} rank 0 of 1" in out and "step 3 loss 0.333" in out
    assert "step 3 loss 0.333" in (run / "logs" / "rank0.log").read_text()
    hb = read_heartbeats(run)[0]  # the node file its writer (local rank 0) left
    assert (hb["phase"], hb["step"], hb["attempt"]) == ("done", 7, "0.0")
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # The program's start and exit frame its step lines (goodput of programs that report none).
    assert [r.get("event") for r in (recs[0], recs[-1])] == ["program_start", "program_exit"], recs
    assert (recs[-1]["rc"], recs[-1]["stopped"]) == (0, False)
    steps = recs[1:-1]
    assert [s["step"] for s in steps] == [1, 2, 3, 7] and steps[-1]["loss"] == 0.125
    assert json.loads((run / "result.json").read_text()) == {
        "final_step": 7,
        "final_loss": 0.125,
        "status": "completed",
    }


def test_a_tqdm_bars_total_reaches_metrics_and_the_runs_record(tmp_path: Path) -> None:
    """A program whose config names no total (job.total_steps=0) but whose
    bar shows n/total: each step record carries the bar's total, and the
    run's one record (status, fleet) says STEP n/total from it."""
    from launcher.views.runsummary import summarize

    p = wrap(tmp_path, "bar")
    out, _ = p.communicate(timeout=60)
    run = tmp_path / "run"
    assert p.returncode == 0, out
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][1:-1]
    assert [(r["step"], r["total"]) for r in steps] == [(1, 3), (2, 3), (3, 3)], steps
    s = summarize(run, {}, write=False)
    assert (s.last_step, s.total_steps) == (3, 3)
    assert json.loads((run / "result.json").read_text())["final_step"] == 3


def test_a_start_that_reports_no_step_ends_at_the_runs_last_step(tmp_path: Path) -> None:
    # The HF Trainer resumed from its final checkpoint prints no step: the
    # result is the run's last step line, not 0.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(step_record(240, 0.5, 0.1, time.time()) + "\n")
    p = wrap(tmp_path, "silent")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    assert json.loads((tmp_path / "run" / "result.json").read_text()) == {
        "final_step": 240,
        "final_loss": 0.5,
        "status": "completed",
    }


def test_a_hangs_stack_signal_gets_the_programs_python_stacks(tmp_path: Path) -> None:
    """Slurm signals every process of the step: the program's faulthandler
    (the stack hook meshrun puts first on its PYTHONPATH) dumps its threads
    to stderr and the wrapper writes them, with py-spy's dump where py-spy
    is installed, to the rank's stack file; the program is not harmed."""
    p = wrap(tmp_path, "hang")
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("ready"):
            break
    os.killpg(p.pid, signal.SIGURG)
    path = tmp_path / "run" / "stacks" / "0.0-rank0.txt"
    deadline = time.monotonic() + 4.5  # within the supervisor's wait (STACK_WAIT_S)
    while time.monotonic() < deadline and "its faulthandler" not in (
        path.read_text() if path.exists() else ""
    ):
        time.sleep(0.1)
    text = path.read_text()
    assert re.match(r"job=script program pid \d+ state [RS];", text), text
    assert "most recent call first" in text and "in stuck_in_a_collective" in text, text
    assert p.poll() is None  # still running: the hook's handler only dumps
    if shutil.which("py-spy", path=os.path.dirname(sys.executable)):
        while time.monotonic() < deadline + PY_SPY_TIMEOUT_S and "py-spy" not in path.read_text():
            time.sleep(0.1)
        assert "--- py-spy dump" in path.read_text() and "stuck_in_a_collective (prog.py" in path.read_text()
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate(timeout=30)


def test_a_stopped_program_leaves_its_rank_without_an_answer(tmp_path: Path) -> None:
    p = wrap(tmp_path, "hang")
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("ready"):
            break
    prog = int(
        (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0].split('"pid": ')[1].split(",")[0]
    )
    os.kill(prog, signal.SIGSTOP)
    os.killpg(p.pid, signal.SIGURG)
    time.sleep(2.5)
    assert not (tmp_path / "run" / "stacks" / "0.0-rank0.txt").exists()  # its node is the one blamed
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate(timeout=30)


def test_program_error_is_recorded_as_the_trainers_failure_line(tmp_path: Path) -> None:
    p = wrap(tmp_path, "fail", SLURM_JOB_ID="99")
    p.communicate(timeout=60)
    assert p.returncode == 1
    line = (tmp_path / "run" / "failures.log").read_text().splitlines()[-1]
    assert re.match(r"^99 0 rank 0 [0-9.]+: ValueError: boom at step 7 \(program exit 1\)$", line), line
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "failed"


def test_program_killed_by_a_signal_kills_the_task_the_same_way(tmp_path: Path) -> None:
    p = wrap(tmp_path, "kill")
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL  # srun then says "Killed", as for a trainer rank
    assert not (tmp_path / "run" / "failures.log").exists()  # no error line: the node is blamed by the signal


def test_usr2_sends_the_stop_signal_and_exits_for_requeue(tmp_path: Path) -> None:
    p = wrap(tmp_path, "wait")
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("ready"):
            break
    t0 = time.monotonic()
    p.send_signal(signal.SIGUSR2)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == taskwrap.REQUEUE_EXIT_CODE, out
    assert "got SIGTERM" in out and time.monotonic() - t0 < 10
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "preempted"


def test_program_that_ignores_the_stop_is_killed_after_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MESHRUN_NODE_HEARTBEAT_DIR", str(tmp_path / "local"))
    p = wrap(tmp_path, "ignore", MESHRUN_KILL_WAIT_S="2")
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("ready"):
            break
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)  # window: min(grace, KillWait=2 s) less the margin: 1.5 s
    time.sleep(0.3)
    # Within the window the save limit applies, not the step limit.
    assert json.loads(heartbeat_path(tmp_path / "run", 0).read_text())["phase"] == "save"
    p.send_signal(signal.SIGTERM)  # a second one changes nothing
    out, _ = p.communicate(timeout=60)
    assert p.returncode == taskwrap.UNCOMMITTED_EXIT_CODE, out
    assert 1.4 < time.monotonic() - t0 < 10
    assert json.loads((tmp_path / "run" / "result.json").read_text())["status"] == "preempted"


# --- render and the local run ----------------------------------------------
def test_sbatch_runs_the_wrapper_under_the_supervisor_with_the_packed_project(tmp_path: Path) -> None:
    from launcher.slurm.render import render_sbatch

    spec = spec_of(tmp_path, "cluster=testcluster", "cluster.nodes=2", "cluster.gpus_per_node=2")
    text = render_sbatch(
        spec, tmp_path / "slurm", python="/py", code_dir="/code", project_dir="/store/abc/project"
    )
    assert "-m launcher.selfheal" in text and f"/py -u -m launcher.taskwrap {spec.run_dir}" in text
    assert "export MESHRUN_PROJECT_DIR=/store/abc/project" in text
    assert "#SBATCH --ntasks-per-node=2" in text and "#SBATCH --signal=USR2@" in text
    spec.cfg.job.launch = "torchrun"
    assert "#SBATCH --ntasks-per-node=1" in render_sbatch(
        spec, tmp_path / "slurm", python="/py", code_dir="/code"
    )


def test_container_mounts_the_project_dir(tmp_path: Path) -> None:
    from launcher.slurm.render import srun_args

    spec = spec_of(
        tmp_path, "cluster=testcluster", "cluster.container_image=/img/pt.sqsh", "cluster.pyxis=true"
    )
    flags = srun_args(spec, str(tmp_path / "slurm"), "/code", project_dir="/store/abc/project")
    mounts = next(f for f in flags if f.startswith("--container-mounts=")).split("=", 1)[1].split(",")
    assert "/store/abc/project:/store/abc/project" in mounts


@pytest.mark.parametrize("launch", ["tasks", "torchrun"])
def test_local_run_of_a_plain_ddp_program(tmp_path: Path, launch: str) -> None:
    run = tmp_path / "run"
    p = launch_toy(
        "job.args=[--steps,4,--save-every,2]",
        f"job.launch={launch}",
        "cluster=local",
        "cluster.local_processes=2",
        run_dir=run,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads((run / "result.json").read_text())["status"] == "completed"
    assert (run / "checkpoints" / "last.pt").exists()  # MESHRUN_CHECKPOINT_DIR
    # One log per task: each rank's, or torchrun's (both ranks' lines).
    logs = [(run / "logs" / f"rank{r}.log").read_text() for r in ((0, 1) if launch == "tasks" else (0,))]
    assert all(log.count("step 4 loss") == (1 if launch == "tasks" else 2) for log in logs), logs
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("step", r.get("event")) for r in recs] == ["program_start", 1, 2, 3, 4, "program_exit"]


def test_dry_run_shows_the_program_not_a_model(tmp_path: Path) -> None:
    from rich.console import Console

    from launcher.views.planreport import print_plan

    cfg = script_cfg('job.args=[--name,"a b"]', "cluster=testcluster")
    console = Console(record=True, width=200)
    print_plan(cfg, make_plan(cfg), console)
    text = console.export_text()
    assert f"{sys.executable} {TOY} --name 'a b'" in text and "parameters" not in text
    assert r"(?i)\b(?:step|iter(?:ation)?)\s*[:=]?\s*(\d+)" in text and "before the time limit" in text


def test_a_sweep_array_runs_the_wrapper_from_the_packed_project(tmp_path: Path) -> None:
    from launcher.slurm.render import array_parameters
    from launcher.slurm.submit import array_key

    a = spec_of(tmp_path / "a", "cluster=testcluster", "job.args=[--steps,2]")
    b = spec_of(tmp_path / "b", "cluster=testcluster", "job.args=[--steps,3]")
    command, params = array_parameters([a, b], str(tmp_path / "slurm"), project_dir="/store/abc/project")
    assert command.endswith('-m launcher.taskwrap "$MESHRUN_ARRAY_RUN_DIR"')
    assert "export MESHRUN_PROJECT_DIR=/store/abc/project" in params["setup"]
    assert array_key(a) == array_key(b)  # one array: same program and project dir
    c = spec_of(tmp_path / "c", "cluster=testcluster", f"job.workdir={tmp_path}")
    assert array_key(c) != array_key(a)  # another project dir: another array (its own packed copy)


def test_the_programs_own_requeue_of_its_job_is_answered_not_run(tmp_path: Path) -> None:
    """In a Slurm job the program's PATH starts with meshrun's scontrol:
    during a stop (the wrapper's mark) ``scontrol requeue <its job>``
    (Lightning's auto-requeue) exits 0 and is not run (the supervisor
    requeues); with no stop under way it is the program's own (a
    self-chaining program) and reaches Slurm's, as any other call."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    real = bin_dir / "scontrol"
    real.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n')
    real.chmod(0o755)
    spec = RunSpec(script_cfg(), make_plan(script_cfg()), str(tmp_path / "run"))
    me = taskwrap.Ranks(0, 0, 1, 1, 0, [0])
    env = taskenv.program_env({"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42"}, spec, me)
    assert env["PATH"].split(":")[0] == str(taskenv.SHIM_DIR) and env["MESHRUN_REAL_SCONTROL"] == str(real)

    def scontrol(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["scontrol", *args], env=env, capture_output=True, text=True, timeout=30)

    assert scontrol("requeue", "42").returncode == 0  # no stop: Slurm's
    Path(env["MESHRUN_STOPPING_FILE"]).parent.mkdir(parents=True)
    Path(env["MESHRUN_STOPPING_FILE"]).touch()  # the wrapper's mark: a stop is under way
    out = scontrol("requeue", "42")
    assert out.returncode == 0 and "meshrun requeues the job at the stop" in out.stderr
    assert scontrol("requeue", "43").returncode == 0 and scontrol("show", "job", "42").returncode == 0
    assert (tmp_path / "calls").read_text().splitlines() == ["requeue 42", "requeue 43", "show job 42"]
    # Outside Slurm, or with no scontrol: the PATH is the task's.
    plain = taskenv.program_env({"PATH": f"{bin_dir}:/usr/bin"}, spec, me)
    assert plain["PATH"] == f"{bin_dir}:/usr/bin" and "MESHRUN_REAL_SCONTROL" not in plain


def test_a_program_that_asks_for_its_requeue_at_a_stop_is_ended_then(tmp_path: Path) -> None:
    """Its request says its save is done: the wrapper ends it at once (exit
    75, requeued), not at the end of the stop window (76, work lost)."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    p = wrap(
        tmp_path, "ask", SLURM_JOB_ID="42", PATH=f"{bin_dir}:{os.environ['PATH']}", MESHRUN_KILL_WAIT_S="30"
    )
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("ready"):
            break
    t0 = time.monotonic()
    p.send_signal(signal.SIGUSR2)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == taskwrap.REQUEUE_EXIT_CODE, out
    assert time.monotonic() - t0 < 10  # the window is 30 s less the margin
    assert not (tmp_path / "calls").exists()  # Slurm's scontrol never ran
    assert (tmp_path / "run" / "progress" / "requeue_asked").exists()
