"""job=script: a team's own program on meshrun's machinery (launcher/plan/script.py,
launcher/taskwrap/wrapper.py, launcher/config/scriptjob.py). No Slurm here; the
cluster test is tests/cluster/test_scriptjob_slurm.py.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_scriptjob.py."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness import TOY, script_cfg, spec_of

from launcher.config.compose import compose
from launcher.config.health import heartbeat_path, read_heartbeats
from launcher.config.scriptjob import bar_total, parse_progress, read_progress_file, step_record
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan
from launcher.taskwrap import taskenv
from launcher.taskwrap import wrapper as taskwrap

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RE = re.compile(compose(["job=script"]).job.progress_regex)


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


@pytest.mark.parametrize(
    ("line", "total"),
    [
        # The Hugging Face Trainer's bar, as tqdm draws it: 200 of 500 steps.
        (" 40%|████      | 200/500 [01:02<01:33,  3.21it/s]", 500),
        ("Epoch 0:   1%|          | 14/2086 [00:01<03:49,  9.03it/s, v_num=0, train_loss=5.830]", 2086),
        ("Training: |          | 7/? [00:00<00:00, 15.10it/s, v_num=2, train_loss=5.810]", None),  # unknown
        ("step 12 loss 0.5", None),  # no bar
        ("[rank0] iter 300/1000 lr 3e-4", None),  # a count, not tqdm's bar
    ],
)
def test_a_bars_total_is_read_beside_its_step(line: str, total: int | None) -> None:
    found = parse_progress(line, DEFAULT_RE)
    assert found is not None and bar_total(line, found[0]) == total
    assert bar_total(" 40%|████      | 1200/500 [01:02<01:33]", 200) is None  # another number's tail


def test_a_tqdm_bars_total_is_recorded_and_status_and_fleet_show_n_of_total(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script job whose config has no total (job.total_steps=0): the bar's
    n/total is the step record's total, and status and fleet show STEP
    n/total from it, never the trainer's train.steps."""
    import io

    from launcher.views import fleetrows, runstate
    from launcher.views.fleettext import step_text
    from launcher.views.runsummary import summarize

    spec = spec_of(tmp_path, "train.steps=40")
    run = Path(spec.run_dir)
    monkeypatch.setenv("MESHRUN_NODE_HEARTBEAT_DIR", str(tmp_path / "local"))
    w = taskwrap.Wrapper(spec, taskwrap.Ranks(0, 0, 1, 1, 0, [0]), ["true"], {**os.environ}, str(tmp_path))
    bar = "".join(f"\r{100 * n // 300:3d}%|#         | {n}/300 [00:0{n}<00:10,  3.21it/s]" for n in (0, 1, 2))
    w.pump(io.BytesIO((bar + "\n{'loss': 0.25}\n").encode()), io.StringIO(), None)
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["total"]) for r in recs] == [(1, 300), (2, 300)]
    s = summarize(run, {}, write=False)
    assert (s.last_step, s.total_steps) == (2, 300)
    assert runstate.format_table(runstate.table(run)).splitlines()[1].split().count("2/300") == 1
    row = fleetrows.run_row(fleetrows.RunRef(str(run), None), {}, {}, time.time(), False)
    assert step_text(row.step, row.steps) == "2/300"
    # A bar with no total ("7/?") leaves it unknown: STEP 7, not 7/40.
    (run / "metrics.jsonl").write_text(step_record(7, None, 0.1, 1000.0) + "\n")
    assert (summarize(run, {}, write=False).total_steps, runstate.table(run)[0].total) == (None, "-")


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
    w.progress = lambda step, loss, total=None: seen.append(step)  # type: ignore[method-assign]
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


def _entry(root: Path, files: dict[str, str]) -> Path:
    """A store entry as launcher/run/codesnap.py leaves it: read-only files
    under ``project/`` and snapshot.json listing them with their digests."""
    import hashlib

    from launcher.run.codesnap import SNAPSHOT_FILE

    packed = root / "project"
    for rel, text in files.items():
        (packed / rel).parent.mkdir(parents=True, exist_ok=True)
        (packed / rel).write_text(text)
        (packed / rel).chmod(0o444)
    sha = {rel: hashlib.sha256(text.encode()).hexdigest() for rel, text in files.items()}
    (root / SNAPSHOT_FILE).write_text(json.dumps({"files": sha}))
    return packed


def test_each_run_gets_its_own_working_copy_of_the_packed_project(tmp_path: Path) -> None:
    """Two runs of one packed project write beside their code without
    seeing each other's files; a task racing another gets the same copy,
    and a restart finds what the program wrote. The copy is the run's own:
    no inode shared with the store, writable by its owner (a program may
    update a project file in place, as in its checkout), never wider."""
    from launcher.taskwrap.workcopy import run_workdir

    live = tmp_path / "live"
    live.mkdir()
    # A live project dir (launcher.code=live) is run in place: it may hold the run dir.
    assert run_workdir(live / "runs" / "x", live) == str(live)
    from launcher.run.codesnap import SNAPSHOT_FILE
    from launcher.taskwrap import workcopy

    assert workcopy.STORE_MARK == SNAPSHOT_FILE
    packed = _entry(tmp_path / "store", {"train.py": "print('hi')\n", "pkg/data.txt": "x\n"})
    a = Path(run_workdir(tmp_path / "a", packed))
    assert a == tmp_path / "a" / "workdir" and (a / "pkg" / "data.txt").read_text() == "x\n"
    assert os.stat(a / "train.py").st_ino != os.stat(packed / "train.py").st_ino  # copied, never linked
    assert stat.S_IMODE(os.stat(a / "train.py").st_mode) == 0o644
    (a / "train.py").write_text("edited in place\n")  # the program's own edit: the store is untouched
    assert (packed / "train.py").read_text() == "print('hi')\n"
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


def test_a_continuation_with_changed_code_runs_the_new_code_and_keeps_the_runs_own_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same run dir resubmitted after a fix: its workdir was made from
    v1's entry and was used as it was (the fixed bug failed again while the
    run record named the fix). Now the code files are brought to v2's entry
    (changed replaced, new added, dropped removed), the program's own files
    kept, the change said; tasks racing on it update it once."""
    from launcher.taskwrap.workcopy import DONE_MARK, made_from, run_workdir

    v1 = _entry(tmp_path / "v1", {"train.py": "raise ValueError('bug in v1')\n", "old/helper.py": "x = 1\n"})
    v2 = _entry(tmp_path / "v2", {"train.py": "print('fixed')\n", "new.py": "y = 2\n"})
    run = tmp_path / "run"
    w = Path(run_workdir(run, v1))
    (w / "out").mkdir()
    (w / "out" / "checkpoint-20").write_text("the run's own")
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(run_workdir(run, v2))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [str(w)] * 4
    assert (w / "train.py").read_text() == "print('fixed')\n" and (w / "new.py").read_text() == "y = 2\n"
    assert not (w / "old").exists()  # the dropped file and its now-empty folder
    assert (w / "out" / "checkpoint-20").read_text() == "the run's own"
    assert made_from(w)["entry"] == str(v2)
    err = capsys.readouterr().err
    assert err.count("this run's code changed since its workdir was made") == 1, err
    assert "1 file(s) updated, 1 added, 1 removed; the run's own files kept" in err
    assert not list(run.glob(".workdir*")) and not list(w.glob("*.tmp"))
    # A copy made before marks listed files (the mark a bare path): what the
    # old entry listed is code; with that entry gone nothing is removed.
    (w / DONE_MARK).write_text(f"{tmp_path / 'gone' / 'project'}\n")
    (w / "stray.py").write_text("kept: not known to be code")
    assert run_workdir(run, v2) == str(w) and (w / "stray.py").exists() and (w / "new.py").exists()


def test_a_job_whose_code_snapshot_is_gone_fails_saying_so_never_runs_the_live_tree(tmp_path: Path) -> None:
    from launcher.config.scriptjob import PROJECT_DIR_ENV
    from launcher.taskwrap.taskenv import program_cwd
    from launcher.taskwrap.workcopy import WorkdirError

    spec = SimpleNamespace(
        run_dir=str(tmp_path / "run"), cfg=SimpleNamespace(job=SimpleNamespace(workdir="/live"))
    )
    assert program_cwd(spec, {}) == "/live"  # a live run (launcher.code=live)
    with pytest.raises(WorkdirError, match=r"code snapshot .*/gone/project is gone .*resubmit.*live /live"):
        program_cwd(spec, {PROJECT_DIR_ENV: str(tmp_path / "gone" / "project")})


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


def _record(run: Path, project: dict) -> Path:
    from launcher.config.runfiles import RECORD_FILE

    run.mkdir(parents=True)
    rec = {"config": {"job": {"script": f"{project['source']}/train.py"}}, "overrides": [], "cwd": str(run)}
    rec["code"] = {"digest": "same", "dir": "/nowhere", "project": project}
    (run / RECORD_FILE).write_text(json.dumps(rec))
    return run


def test_diff_and_rerun_cover_the_programs_project(tmp_path: Path) -> None:
    """Finding 9: runs with LR = 0.1 and LR = 10.0 in the user's train.py
    were reported identical (diff compared meshrun's code only), and rerun
    re-packed the live project. Now diff names the project's file and shows
    its lines; rerun points job.workdir and job.script at the recorded copy."""
    from launcher.commands.rerun import project_overrides
    from launcher.views.rundiff import diff_runs, report

    live = tmp_path / "proj"
    live.mkdir()
    entries = {}
    for name, lr in (("a", "0.1"), ("b", "10.0")):
        entries[name] = _entry(
            tmp_path / "store" / name, {"train.py": f"LR = {lr}\\n", "util.py": "x = 1\\n"}
        )
    a = _record(tmp_path / "a", {"source": str(live), "dir": str(entries["a"]), "digest": "d-a"})
    b = _record(tmp_path / "b", {"source": str(live), "dir": str(entries["b"]), "digest": "d-b"})
    d = diff_runs(str(a), str(b))
    assert d.causes["code"] == ["project train.py (changed)"], d.causes
    text = "\\n".join(report(d))
    assert "-LR = 0.1" in text and "+LR = 10.0" in text and "1 difference(s): code 1" in text
    rec = json.loads((b / "run_record.json").read_text())
    notes: list[str] = []
    assert project_overrides(rec, notes) == [
        f'job.workdir="{entries["b"]}"',
        f'job.script="{entries["b"] / "train.py"}"',
    ]
    assert "the program's project as submitted" in notes[0] and f"not the live {live}" in notes[0]
    # Its copy gone: the live project, said with whether it still holds the same files.
    rec["code"]["project"]["dir"] = str(tmp_path / "gone" / "project")
    notes = []
    assert project_overrides(rec, notes) == [] and "snapshot is gone" in notes[0] and "CHANGED" in notes[0]
