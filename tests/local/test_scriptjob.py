"""job=script: a team's own program on meshrun's machinery (launcher/plan/script.py,
launcher/taskwrap/wrapper.py, launcher/config/scriptjob.py). No Slurm here; the
cluster test is tests/cluster/test_scriptjob_slurm.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from harness import TOY, launch_toy

from launcher.config.compose import compose
from launcher.config.health import heartbeat_path, read_heartbeats
from launcher.config.scriptjob import parse_progress, read_progress_file, step_record
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan
from launcher.taskwrap import taskenv
from launcher.taskwrap import wrapper as taskwrap
from launcher.taskwrap.stacks import PY_SPY_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RE = re.compile(compose(["job=script"]).job.progress_regex)


def script_cfg(*overrides: str, script: str | None = str(TOY)):
    return compose(["job=script", *([f"job.script={script}"] if script else []), *overrides])


def spec_of(tmp_path: Path, *overrides: str, script: str | None = str(TOY)) -> RunSpec:
    from launcher.run.rundir import write_run_dir

    cfg = script_cfg(*overrides, script=script)
    spec = RunSpec(cfg, make_plan(cfg), str(tmp_path / "run"))
    write_run_dir(spec)
    return spec


# --- validation: refused before anything is written ----------------------
@pytest.mark.parametrize(
    ("overrides", "script", "words"),
    [
        ((), None, ["job.module=''", "exactly one of job.script=FILE or job.module=NAME"]),
        (("job.module=pkg.train",), str(TOY), ["job.script=", "exactly one of"]),
        ((), "/nonexistent/train.py", ["job.script='/nonexistent/train.py'", "no such file"]),
        (
            ("job.python=/nonexistent/python3",),
            str(TOY),
            ["job.python='/nonexistent/python3'", "no such interpreter"],
        ),
        (
            ("job.python=no-such-python-here",),
            str(TOY),
            ["job.python='no-such-python-here'", "no such interpreter"],
        ),
        (("job.module=1bad.name",), None, ["job.module='1bad.name'", "dotted module name"]),
        (("job.progress_regex='step (\\d+'",), str(TOY), ["job.progress_regex=", "not a regular expression"]),
        (("job.progress_regex='step \\d+'",), str(TOY), ["job.progress_regex=", "group capturing the step"]),
        (("parallelism.tp=2",), str(TOY), ["parallelism.tp=2", "only the data-parallel world size"]),
        (("parallelism.pp=4",), str(TOY), ["parallelism.pp=4", "only the data-parallel world size"]),
        (("job.stop_signal=SIGKILL",), str(TOY), ["job.stop_signal='SIGKILL'", "choose one of SIGTERM"]),
        (("job.launch=mpirun",), str(TOY), ["job.launch='mpirun'", "choose one of tasks, torchrun"]),
        (("job.elastic=true",), str(TOY), ["job.elastic=True", "not supported"]),
        (("job.workdir=/nonexistent/dir",), str(TOY), ["job.workdir='/nonexistent/dir'", "not a directory"]),
        (("job.workdir='/tmp/a\nb'",), str(TOY), ["job.workdir='/tmp/a\\nb'", "control characters"]),
        (
            ("job.resume_from=out/checkpoint-*",),
            str(TOY),
            ["job.resume_args=[]", "with {path} for the newest"],
        ),
        (
            ('job.resume_args=[--resume,"{path}"]',),
            str(TOY),
            ["job.resume_from=''", "a glob of the program's"],
        ),
        (
            ("job.resume_from=out/*", 'job.resume_args=[--resume,"{step}"]'),
            str(TOY),
            ["job.resume_args=['--resume', '{step}']", "{step} is not known: {path}"],
        ),
    ],
)
def test_bad_input_is_refused_naming_field_and_nothing_is_written(
    tmp_path: Path, overrides: tuple[str, ...], script: str | None, words: list[str]
) -> None:
    from launcher.entry.launch import launch

    run_dir = tmp_path / "run"
    cfg = script_cfg(*overrides, "cluster=local", f"launcher.runs_root={tmp_path}/runs", script=script)
    with pytest.raises(ConfigError) as e:
        launch(cfg, str(run_dir))
    for w in words:
        assert w in str(e.value), str(e.value)
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_args_not_a_list_is_refused_at_composition() -> None:
    with pytest.raises(
        ConfigError, match=r"job.args='--epochs 2' is invalid: a list, e.g. job.args=\[--epochs,2\]"
    ):
        compose(["job=script", f"job.script={TOY}", "job.args=--epochs 2"])


def test_defaults_python_workdir_and_the_plan_is_the_data_parallel_world() -> None:
    cfg = script_cfg("cluster=testcluster", "cluster.nodes=2", "cluster.gpus_per_node=2")
    plan = make_plan(cfg)
    assert cfg.job.python == sys.executable
    assert cfg.job.workdir == str(ROOT)  # the nearest parent with .git / pyproject.toml
    assert (plan.mode, plan.world_size, plan.dp, plan.tp, plan.pp) == ("script", 4, 4, 1, 1)
    assert plan.cost is None and plan.signal_lead_s >= 30
    img = script_cfg(
        "cluster=testcluster",
        "cluster.pyxis=true",
        "cluster.container_image=nvcr.io/nvidia/pytorch:24.01-py3",
        "cluster.container_python=python3",
    )
    make_plan(img)
    assert img.job.python == "python3"  # the image's, not this interpreter


def test_workdir_without_a_project_marker_is_the_scripts_dir(tmp_path: Path) -> None:
    from launcher.config.scriptjob import project_root

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "pyproject.toml").write_text("")
    assert project_root(str(tmp_path / "a" / "b" / "t.py")) == str(tmp_path / "a")
    loose = tmp_path / "loose"
    loose.mkdir()
    if not any((p / m).exists() for p in loose.parents for m in (".git", "pyproject.toml")):
        assert project_root(str(loose / "t.py")) == str(loose)


# --- the task's environment ----------------------------------------------
SLURM_TASK = {
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_ID": "62",
    "MASTER_ADDR": "10.0.0.7",
    "MASTER_PORT": "20062",
    "PYTHONSAFEPATH": "1",
    "PYTHONPATH": f"{taskenv.CODE_DIR}:/opt/team/lib",
}


def test_slurm_task_gets_torchrun_variables_and_meshruns(tmp_path: Path) -> None:
    spec = spec_of(tmp_path, "cluster=testcluster", "cluster.nodes=2", "cluster.gpus_per_node=2")
    me = taskenv.task_ranks(SLURM_TASK, spec)
    env = taskenv.program_env(SLURM_TASK, spec, me)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")} == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
    }
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.7", "20062")
    run = Path(spec.run_dir)
    assert env["MESHRUN_RUN_DIR"] == str(run)
    assert env["MESHRUN_CHECKPOINT_DIR"] == str(run / "checkpoints")
    assert env["MESHRUN_PROGRESS_FILE"] == str(run / "progress" / "rank3")
    # meshrun's code dir and its -m safety setting are not the program's; the
    # stack hook (a sitecustomize that takes itself off sys.path) comes first
    assert env["PYTHONPATH"] == f"{taskenv.STACK_HOOK_DIR}:/opt/team/lib" and "PYTHONSAFEPATH" not in env
    assert me.reports == [3]


def test_rendezvous_falls_back_to_the_steps_first_node_and_the_jobs_port() -> None:
    env = {"SLURM_STEP_NODELIST": "gpu-a17", "SLURM_JOB_ID": "123456"}
    assert taskenv.rendezvous(env) == ("gpu-a17", str(20000 + 123456 % 20000))
    assert taskenv.rendezvous({}) == ("127.0.0.1", "29500")


def test_argv_is_verbatim_and_torchrun_rendezvous_is_c10d_on_the_first_node(tmp_path: Path) -> None:
    hostile = ["--name", "a b; rm -rf / $(id)", "--lr=0.1"]
    args = "job.args=[" + ",".join(json.dumps(a) for a in hostile) + "]"
    spec = spec_of(tmp_path, args, "cluster=testcluster", "cluster.nodes=2", "cluster.gpus_per_node=2")
    me = taskenv.task_ranks(SLURM_TASK, spec)
    env = taskenv.program_env(SLURM_TASK, spec, me)
    argv = taskenv.program_argv(spec, me, env, str(ROOT))
    assert argv == [sys.executable, str(TOY), *hostile]
    copy = tmp_path / "copy"
    assert taskenv.program_argv(spec, me, env, str(copy))[1] == str(copy / "tests/programs/ddp_toy.py")
    spec.cfg.job.launch = "torchrun"
    me = taskenv.task_ranks({**SLURM_TASK, "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, spec)
    assert (me.node, me.reports) == (1, [2, 3])
    env = taskenv.program_env(SLURM_TASK, spec, me)
    argv = taskenv.program_argv(spec, me, env, str(ROOT))
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert {
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.7:20062",
    } <= set(argv)
    assert argv[-4:] == [str(TOY), *hostile] and "RANK" not in env  # torchrun sets the ranks


def test_resume_args_name_the_newest_checkpoint_only_once_one_exists(tmp_path: Path) -> None:
    """A program that resumes only when told where (the HF Trainer's scripts):
    its first start gets job.args alone; a later start the newest match in
    the natural order of its numbers (checkpoint-10 after checkpoint-9) and
    only checkpoints whose last file was written (the glob's choice)."""
    from launcher.config.scriptjob import newest_match

    spec = spec_of(
        tmp_path,
        "job.args=[--epochs,2]",
        "job.resume_from=out/checkpoint-*/trainer_state.json",
        'job.resume_args=[--resume_from_checkpoint,"{dir}","--note={path}"]',  # {} quoted for Hydra
    )
    me = taskenv.task_ranks(SLURM_TASK, spec)
    env = taskenv.program_env(SLURM_TASK, spec, me)
    pattern = spec.cfg.job.resume_from
    assert newest_match(pattern, tmp_path) == ""
    assert taskenv.program_argv(spec, me, env, str(tmp_path), "")[2:] == ["--epochs", "2"]
    for n in (9, 10, 2, 11):
        (tmp_path / "out" / f"checkpoint-{n}").mkdir(parents=True)
        if n != 11:  # killed mid-save: no trainer_state.json yet
            (tmp_path / "out" / f"checkpoint-{n}" / "trainer_state.json").write_text("{}")
    newest = newest_match(pattern, tmp_path)
    ck = tmp_path / "out" / "checkpoint-10"
    assert newest == str(ck / "trainer_state.json")
    assert newest_match(str(tmp_path / pattern), "/elsewhere") == newest  # absolute globs too
    assert taskenv.program_argv(spec, me, env, str(tmp_path), newest)[2:] == [
        "--epochs", "2", "--resume_from_checkpoint", str(ck), f"--note={newest}",
    ]  # fmt: skip
    spec.cfg.job.launch = "torchrun"
    assert taskenv.program_argv(spec, me, env, str(tmp_path), newest)[-4:] == [
        "2", "--resume_from_checkpoint", str(ck), f"--note={newest}",
    ]  # fmt: skip


# --- progress ------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "found"),
    [
        ("step 12 loss 0.5", (12, 0.5)),
        ("Step: 7 | loss=1.2e-3", (7, 1.2e-3)),
        ("[rank0] iter 300/1000 lr 3e-4", (300, None)),
        ("Iteration=4 train_loss: 2.5", (4, 2.5)),
        # tqdm's bar (Lightning's, Hugging Face Trainer's)
        ("Epoch 0:   1%|          | 14/2086 [00:01<03:49,  9.03it/s, v_num=0, train_loss=5.830]", (14, 5.83)),
        (" 40%|####      | 200/500 [01:02<01:33,  3.21it/s]", (200, None)),
        ("Training: |          | 7/? [00:00<00:00, 15.10it/s, v_num=2, train_loss=5.810]", (7, 5.81)),
        ("ratio 3/4 done", None),
        ("Training: |          | 0/? [00:00<?, ?it/s]", None),  # the bar's first draw: no step done
        # Other bars are no training step: datasets' preprocessing, a save's
        # shards (a nested bar, after a cursor-up escape), Lightning's validation.
        ("Truncating train dataset:  15%|█▌        | 3000/20000 [00:00<00:00, 29486.41 examples/s]", None),
        ("Map (num_proc=4): 100%|██████████| 20000/20000 [00:01<00:00, 1.2e4 examples/s]", None),
        ("\x1b[AWriting model shards: 100%|██████████| 1/1 [00:00<00:00, 462.54it/s]", None),
        ("Validation DataLoader 0:  50%|█████     | 1/2 [00:00<00:00,  9.01it/s]", None),
        (" 83%|████████▎ | 25/30 [00:01<00:00, 20.20it/s]", (25, None)),
        ("epoch 3 done", None),
        ("steps_per_epoch 5", None),
        ("warmup 10 steps", None),
    ],
)
def test_progress_lines(line: str, found: tuple[int, float | None] | None) -> None:
    assert parse_progress(line, DEFAULT_RE) == found


def test_progress_file_forms(tmp_path: Path) -> None:
    p = tmp_path / "rank0"
    for text, want in [
        ("5", (5, None)),
        ('{"step": 9, "loss": 1.5}', (9, 1.5)),
        ('{"step": ', None),
        ("x", None),
    ]:
        p.write_text(text)
        assert read_progress_file(p) == want
    assert read_progress_file(tmp_path / "missing") is None


def test_step_record_has_the_trainers_shape_for_goodput(tmp_path: Path) -> None:
    from launcher.views import goodput

    (tmp_path / "metrics.jsonl").write_text(
        step_record(3, 0.25, 0.5, 1000.0) + "\n" + step_record(4, None, 0.5, 1000.5) + "\n"
    )
    assert goodput._STEP_LINE.match(step_record(3, 0.25, 0.5, 1000.0))
    recs = goodput.read_records(tmp_path)
    assert [(r["step"], r["step_time_s"], r["time"]) for r in recs] == [(3, 0.5, 1000.0), (4, 0.5, 1000.5)]


def test_heartbeat_equals_the_trainers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from train.observe import heartbeat

    run = tmp_path / "run"
    run.mkdir()
    env = {"MESHRUN_ATTEMPT": "0.1", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "2", "RANK": "0"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MESHRUN_NODE_HEARTBEAT_DIR", str(tmp_path / "local"))
    heartbeat.start(str(run))
    heartbeat.beat("step", 5)
    trainer = json.loads(heartbeat_path(run, 0).read_text())
    spec = RunSpec(script_cfg(), make_plan(script_cfg()), str(run))
    w = taskwrap.Wrapper(spec, taskwrap.Ranks(1, 1, 2, 2, 0, [1]), ["true"], dict(os.environ), str(tmp_path))
    (run / "heartbeats").mkdir(exist_ok=True)
    w.progress(4, None)
    w.progress(5, 0.1)
    ours = json.loads(heartbeat_path(run, 1).read_text())
    assert list(ours) == list(trainer)
    assert {k: ours[k] for k in ("job", "step_id", "attempt", "phase", "step")} == {
        k: trainer[k] for k in ("job", "step_id", "attempt", "phase", "step")
    }
    assert [type(v) for v in ours.values()] == [type(v) for v in trainer.values()]
    import faulthandler

    faulthandler.unregister(signal.SIGURG)  # heartbeat.start registered it in this process
    # The same code carries both through the node file (rank 0's task is the node's writer).
    assert heartbeat._writer is not None
    heartbeat._writer.stop()
    assert read_heartbeats(run) == {0: trainer, 1: ours}
    assert not list((run / "heartbeats").glob("rank*.json"))  # nothing per rank on the shared dir
    monkeypatch.setattr(heartbeat, "_run_dir", None)
    monkeypatch.setattr(heartbeat, "_writer", None)


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


def test_repeated_and_restarting_step_counters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks' lines under torchrun say each step twice: one step line.
    A counter that starts again each epoch still beats (no false hang), but
    metrics.jsonl keeps only steps past the highest."""
    run = tmp_path / "run"
    (run / "heartbeats").mkdir(parents=True)
    monkeypatch.setenv("MESHRUN_NODE_HEARTBEAT_DIR", str(tmp_path / "local"))
    spec = RunSpec(script_cfg(), make_plan(script_cfg()), str(run))
    env = {**os.environ, "MESHRUN_ATTEMPT": "0.0"}
    w = taskwrap.Wrapper(spec, taskwrap.Ranks(0, 0, 2, 2, 0, [0, 1]), ["true"], env, str(tmp_path))
    beats = []
    for step in (1, 1, 2, 2, 3, 1, 2):
        w.progress(step, None)
        beats.append(json.loads(heartbeat_path(run, 1).read_text())["step"])
    assert beats == [1, 1, 2, 2, 3, 1, 2]
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert w.step == 3


def test_a_progress_bar_redrawn_with_carriage_returns_beats_at_each_redraw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tqdm ends its line only when the bar is done: each redraw (a carriage
    return) is read as it comes, the output is copied byte for byte, and
    the tail keeps each line's last redraw."""
    import io

    run = tmp_path / "run"
    (run / "heartbeats").mkdir(parents=True)
    monkeypatch.setenv("MESHRUN_NODE_HEARTBEAT_DIR", str(tmp_path / "local"))
    spec = RunSpec(script_cfg(), make_plan(script_cfg()), str(run))
    w = taskwrap.Wrapper(spec, taskwrap.Ranks(0, 0, 1, 1, 0, [0]), ["true"], {**os.environ}, str(tmp_path))
    seen: list[int] = []
    w.progress = lambda step, loss: seen.append(step)  # type: ignore[method-assign]
    r, wfd = os.pipe()
    src = os.fdopen(r, "rb")
    out = io.StringIO()
    t = threading.Thread(target=w.pump, args=(src, out, None))
    t.start()
    bar = "".join(f"\rEpoch 0: | {n}/500 [00:0{n}<00:10, loss=0.{n}]" for n in range(1, 4))
    os.write(wfd, bar.encode())
    deadline = time.monotonic() + 10
    while seen != [1, 2] and time.monotonic() < deadline:  # the last redraw may still grow
        time.sleep(0.01)
    assert seen == [1, 2]  # read before any newline
    os.write(wfd, "\nstep 7 héllo\n".encode())
    os.close(wfd)
    t.join(10)
    assert seen == [1, 2, 3, 7]
    assert out.getvalue() == bar + "\nstep 7 héllo\n"
    assert list(w.tail)[-2:] == ["Epoch 0: | 3/500 [00:03<00:10, loss=0.3]", "step 7 héllo"]


def test_each_run_gets_its_own_working_copy_of_the_packed_project(tmp_path: Path) -> None:
    """Two runs of one packed project write beside their code without
    seeing each other's files; a task racing another gets the same copy,
    and a restart finds what the program wrote."""
    from launcher.taskwrap.workcopy import run_workdir

    packed = tmp_path / "store" / "project"
    (packed / "pkg").mkdir(parents=True)
    # A live project dir (launcher.code=live) is run in place: it may hold the run dir.
    assert run_workdir(tmp_path / "store" / "project" / "runs" / "x", packed) == str(packed)
    from launcher.run.codesnap import SNAPSHOT_FILE
    from launcher.taskwrap import workcopy

    assert workcopy.STORE_MARK == SNAPSHOT_FILE
    (tmp_path / "store" / SNAPSHOT_FILE).write_text("{}")
    (packed / "train.py").write_text("print('hi')\n")
    (packed / "pkg" / "data.txt").write_text("x\n")
    for f in (packed / "train.py", packed / "pkg" / "data.txt"):
        f.chmod(0o444)
    a = Path(run_workdir(tmp_path / "a", packed))
    assert a == tmp_path / "a" / "workdir" and (a / "pkg" / "data.txt").read_text() == "x\n"
    assert os.stat(a / "train.py").st_ino == os.stat(packed / "train.py").st_ino  # linked, not copied
    (a / "hpc_ckpt_1.ckpt").write_text("a's")
    b = Path(run_workdir(tmp_path / "b", packed))
    assert not (b / "hpc_ckpt_1.ckpt").exists() and not (packed / "hpc_ckpt_1.ckpt").exists()
    assert Path(run_workdir(tmp_path / "a", packed)) == a and (a / "hpc_ckpt_1.ckpt").read_text() == "a's"
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(run_workdir(tmp_path / "c", packed))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [str(tmp_path / "c" / "workdir")] * 4
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["workdir"]  # no half-made copy left


def test_a_step_line_without_a_loss_reads_in_status_fleet_and_diff(tmp_path: Path) -> None:
    from launcher.views import fleetrows as fleet
    from launcher.views import rundiff
    from launcher.views import runstate as status

    run = spec_of(tmp_path).run_dir
    Path(run, "metrics.jsonl").write_text(
        step_record(8, 0.5, 0.1, 1000.0) + "\n" + step_record(9, None, 0.1, 1000.1) + "\n"
    )
    assert status.last_metrics(run)[:2] == ("9", "-")
    assert fleet._tail_metrics(Path(run))["step"] == 9
    assert [s for s, _ in rundiff.losses(run)] == [8]


def test_the_programs_own_requeue_of_its_job_is_answered_not_run(tmp_path: Path) -> None:
    """In a Slurm job the program's PATH starts with meshrun's scontrol:
    ``scontrol requeue <its job>`` (Lightning's auto-requeue) exits 0 and is
    not run (the supervisor requeues); any other call reaches Slurm's."""
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

    out = scontrol("requeue", "42")
    assert out.returncode == 0 and "meshrun requeues the job at the stop" in out.stderr
    assert scontrol("requeue", "43").returncode == 0 and scontrol("show", "job", "42").returncode == 0
    assert (tmp_path / "calls").read_text().splitlines() == ["requeue 43", "show job 42"]
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
