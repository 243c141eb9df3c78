"""The checkpoint worker process (train/checkpoint/worker.py): a sharded
save written by the workers equals DCP's own save of the same state; the
worker never outlives its trainer; a dead worker fails the rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from harness import free_port

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_sharded_save_by_workers_equals_dcp_save(tmp_path: Path) -> None:
    """FSDP2 over 2 ranks: the workers get only local shards and their chunk
    metadata (no device mesh), and write the checkpoint DTensor's own DCP
    save would: same chunks per key, same values on load."""
    port = free_port()
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "ckpt_worker_ranks.py"), str(tmp_path)],
            env=dict(env, RANK=str(r)),
        )
        for r in range(2)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        assert r["worker_pid"] != r["trainer_pid"]
        assert r["worker_equal"] and r["direct_equal"], r
    assert results[0]["same_metadata"], results[0]
    assert results[0]["sharded_keys"] >= 6, results[0]  # 3 weights, 3 biases, their AdamW moments


SAVE_AND_WAIT = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, {scripts!r})
    import torch
    from ckpt_drill import build_model
    from launcher.plan.make import make_plan
    from launcher.config.schema import ClusterConfig, RunConfig
    from launcher.config.spec import RunSpec
    from train.checkpoint import CheckpointManager
    from train.parallel.dist import DistInfo
    from train.loop.state import ModelState, OptimState

    cfg = RunConfig(cluster=ClusterConfig(local_processes=1))
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir={run_dir!r}, run_id="worker-test-0001")
    model = build_model(32, 2, 1)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = CheckpointManager(spec, DistInfo(0, 1, 0, 1, 0, "cpu", "gloo", "127.0.0.1", 0))
    # Slurm's SIGTERM to every process of the step, while the worker starts.
    for _ in range(20):
        os.kill(ckpt.worker.proc.pid, signal.SIGTERM)
        time.sleep(0.1)
    ckpt.save(1, {{"model": ModelState([model]), "optim": OptimState([model], [opt])}})
    ckpt._wait_pending()
    print(ckpt.worker.proc.pid, flush=True)
    time.sleep(600)
    """
)


def test_worker_ignores_stop_signals_and_dies_with_its_trainer(tmp_path: Path) -> None:
    code = SAVE_AND_WAIT.format(scripts=str(REPO / "scripts"), run_dir=str(tmp_path / "run"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    trainer = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout is not None
        worker_pid = int(trainer.stdout.readline())
        assert _alive(worker_pid)
        assert (tmp_path / "run" / "checkpoints" / "step_1" / "manifest.json").exists()
        # Every thread of the worker runs at SCHED_IDLE (a waking training
        # thread preempts it at once); the trainer keeps the normal policy.
        tids = [int(t) for t in os.listdir(f"/proc/{worker_pid}/task")]
        assert {os.sched_getscheduler(t) for t in tids} == {os.SCHED_IDLE}, tids
        assert os.sched_getscheduler(trainer.pid) == os.SCHED_OTHER
        # The worker ignores the stop signals Slurm sends to every process of a step.
        os.kill(worker_pid, signal.SIGTERM)
        time.sleep(1)
        assert _alive(worker_pid)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
        deadline = time.monotonic() + 10
        while _alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker_pid), "the checkpoint worker outlived its trainer"
    finally:
        trainer.kill()


STOP_WHILE_SPAWNING = textwrap.dedent(
    """
    import multiprocessing.context as mpc, os, signal, sys, threading, time
    sys.path.insert(0, {scripts!r})
    from launcher.plan.make import make_plan
    from launcher.config.schema import ClusterConfig, RunConfig
    from launcher.config.spec import RunSpec
    from train.checkpoint import CheckpointManager
    from train.parallel.dist import DistInfo

    got = []
    signal.signal(signal.SIGTERM, lambda *_: got.append("TERM"))
    # One more thread, as gloo's and the store's: it does not block SIGTERM.
    idle = threading.Event()
    threading.Thread(target=idle.wait, daemon=True).start()
    start = mpc.SpawnProcess.start

    def start_and_signal(self):
        os.kill(os.getpid(), signal.SIGTERM)  # process-directed, mid-spawn
        time.sleep(0.2)
        start(self)

    mpc.SpawnProcess.start = start_and_signal
    cfg = RunConfig(cluster=ClusterConfig(local_processes=1))
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir={run_dir!r}, run_id="worker-test-0002")
    ckpt = CheckpointManager(spec, DistInfo(0, 1, 0, 1, 0, "cpu", "gloo", "127.0.0.1", 0))
    for _ in range(50):
        if got:
            break
        time.sleep(0.02)
    print(got, signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL),
          ckpt.worker.proc.is_alive(), flush=True)
    """
)


def test_stop_signal_while_the_worker_spawns_is_not_lost(tmp_path: Path) -> None:
    """A process-directed SIGTERM that arrives while the worker is being
    spawned reaches the trainer's handler, with another thread alive (the
    old spawn set SIGTERM ignored process-wide and lost it on that thread)."""
    code = STOP_WHILE_SPAWNING.format(scripts=str(REPO / "scripts"), run_dir=str(tmp_path / "run"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[0] == "['TERM'] True True", out.stdout + out.stderr[-3000:]


def test_dead_worker_fails_the_next_save(tmp_path: Path) -> None:
    import torch
    from ckpt_drill import build_model

    from launcher.config.schema import ClusterConfig, RunConfig
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from train.checkpoint import CheckpointManager
    from train.loop.state import ModelState, OptimState
    from train.parallel.dist import DistInfo

    cfg = RunConfig(cluster=ClusterConfig(local_processes=1))
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path / "run"), run_id="worker-test-0002")
    model = build_model(32, 2, 1)
    opt = torch.optim.AdamW(model.parameters())
    state = {"model": ModelState([model]), "optim": OptimState([model], [opt])}
    ckpt = CheckpointManager(spec, DistInfo(0, 1, 0, 1, 0, "cpu", "gloo", "127.0.0.1", 0))
    ckpt.save(1, state)
    ckpt._wait_pending()
    ckpt.worker.proc.kill()
    ckpt.worker.proc.join(10)
    with pytest.raises(RuntimeError, match="checkpoint worker .* died"):
        ckpt.save(2, state)
        ckpt._wait_pending()
    assert ckpt.committed == [1]


def test_saves_without_a_step_between_and_resume_equal(tmp_path: Path) -> None:
    """Two saves with no optimizer step between them (each holds the next
    step until its staging is done; the old one-shot hooks broke the
    optimizer's hook loop: 'OrderedDict mutated during iteration'), then
    training on and a third save. The worker writes without zip CRC32s and
    hashes while writing; the manifest matches the files and the resumed
    state equals the one saved."""
    import torch
    from ckpt_drill import build_model

    from launcher.config.schema import ClusterConfig, RunConfig
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from train.checkpoint import CheckpointManager
    from train.loop.state import ModelState, OptimState
    from train.parallel.dist import DistInfo

    cfg = RunConfig(cluster=ClusterConfig(local_processes=1))
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path / "run"), run_id="worker-test-0003")
    info = DistInfo(0, 1, 0, 1, 0, "cpu", "gloo", "127.0.0.1", 0)

    def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        model(torch.randn(4, 32)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    model = build_model(32, 2, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    state = {"model": ModelState([model]), "optim": OptimState([model], [opt])}
    train_step(model, opt)
    ckpt = CheckpointManager(spec, info)
    ckpt.save(1, state)
    ckpt.save(2, state)
    train_step(model, opt)
    train_step(model, opt)
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    saved_avg = [opt.state[p]["exp_avg"].clone() for p in model.parameters()]
    ckpt.save(3, state)
    train_step(model, opt)  # the held step waits for step 3's staging, then changes the live state
    assert ckpt.finalize(timeout_s=120)["committed_steps"] == [1, 2, 3]
    assert len(ckpt.blocked_s) == 3
    assert any(not torch.equal(saved[k], v) for k, v in model.state_dict().items())
    # The worker hashes each file as DCP writes it: the manifest equals a re-read.
    from train.checkpoint.manifest import file_digest, read_manifest

    manifest = read_manifest(os.path.join(ckpt.root, "step_3"))
    assert manifest is not None and len(manifest.files) >= 3
    for name, entry in manifest.files.items():
        path = os.path.join(ckpt.root, "step_3", name)
        assert (entry.size, entry.digest) == (os.path.getsize(path), file_digest(path, entry.algo)), name

    fresh = build_model(32, 2, 1)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.05)
    train_step(fresh, fresh_opt)  # optimizer state to be overwritten
    reader = CheckpointManager(spec, info)
    assert reader.resume({"model": ModelState([fresh]), "optim": OptimState([fresh], [fresh_opt])}) == 3
    reader.finalize(timeout_s=60)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, saved[k]), k
    for p, avg in zip(fresh.parameters(), saved_avg, strict=True):
        assert torch.equal(fresh_opt.state[p]["exp_avg"], avg)


MANY_TENSORS = textwrap.dedent(
    """
    import json, os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    sys.path.insert(0, {scripts!r})
    import torch
    from ckpt_drill import build_model
    from launcher.plan.make import make_plan
    from launcher.config.schema import ClusterConfig, RunConfig
    from launcher.config.spec import RunSpec
    from train.checkpoint import CheckpointManager
    from train.parallel.dist import DistInfo
    from train.loop.state import ModelState, OptimState

    cfg = RunConfig(cluster=ClusterConfig(local_processes=1))
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir={run_dir!r}, run_id="worker-test-0004")
    info = DistInfo(0, 1, 0, 1, 0, "cpu", "gloo", "127.0.0.1", 0)
    model = build_model(8, {layers}, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    state = {{"model": ModelState([model]), "optim": OptimState([model], [opt])}}

    def step():
        model(torch.randn(2, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    step()
    ckpt = CheckpointManager(spec, info)
    ckpt.save(1, state)
    step()
    ckpt.save(2, state)
    ckpt._wait_pending()
    fds = {{"trainer": len(os.listdir("/proc/self/fd")),
            "worker": len(os.listdir(f"/proc/{{ckpt.worker.proc.pid}}/fd"))}}
    saved = {{k: v.detach().clone() for k, v in model.state_dict().items()}}
    tensors = len(ckpt._stager.buffers)
    report = ckpt.finalize(timeout_s=120)
    fresh = build_model(8, {layers}, 1)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.05)
    reader = CheckpointManager(spec, info)
    resumed = reader.resume({{"model": ModelState([fresh]), "optim": OptimState([fresh], [fresh_opt])}})
    reader.finalize(timeout_s=60)
    equal = all(torch.equal(v, saved[k]) for k, v in fresh.state_dict().items())
    print(json.dumps({{"committed": report["committed_steps"], "fds": fds, "tensors": tensors,
                       "resumed": resumed, "equal": equal}}), flush=True)
    """
)


def test_many_tensors_save_under_a_stock_descriptor_limit(tmp_path: Path) -> None:
    """A state of 1,200 tensors (an 8B model has ~1,160 a rank) under
    ``ulimit -n 1024``: staging holds one shared-memory segment, not one
    descriptor per tensor, so both saves commit and resume equal; trainer and
    worker each hold a few dozen descriptors, not thousands."""
    layers = 150  # 300 parameters; with AdamW's step, exp_avg, exp_avg_sq: 1,200 tensors
    code = MANY_TENSORS.format(scripts=str(REPO / "scripts"), run_dir=str(tmp_path / "run"), layers=layers)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["tensors"] == 4 * 2 * layers, result
    assert result["committed"] == [1, 2], (result, out.stderr[-3000:])
    assert result["resumed"] == 2 and result["equal"], result
    assert result["fds"]["trainer"] < 200 and result["fds"]["worker"] < 200, result
    assert "Too many open files" not in out.stderr


def test_stalled_worker_fails_the_save_and_the_run(tmp_path: Path) -> None:
    """A worker that makes no progress (stopped: SIGSTOP, as a hung
    filesystem would hold it) for storage.worker_stall_timeout_s: the save
    is counted as failed, never as committed, and CheckpointError stops
    the run."""
    import torch
    from ckpt_drill import build_model

    from launcher.config.schema import ClusterConfig, RunConfig
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from train.checkpoint import CheckpointManager
    from train.checkpoint.saving import CheckpointError
    from train.loop.state import ModelState, OptimState
    from train.parallel.dist import DistInfo

    cfg = RunConfig(cluster=ClusterConfig(local_processes=1))
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path / "run"), run_id="worker-test-0005")
    model = build_model(32, 2, 1)
    opt = torch.optim.AdamW(model.parameters())
    state = {"model": ModelState([model]), "optim": OptimState([model], [opt])}
    ckpt = CheckpointManager(spec, DistInfo(0, 1, 0, 1, 0, "cpu", "gloo", "127.0.0.1", 0))
    ckpt.save(1, state)
    ckpt._wait_pending()
    assert ckpt.poll() == [(1, "")]
    # Short from here on (the first save also waited for the worker's start).
    cfg.storage.worker_stall_timeout_s = 3.0
    os.kill(ckpt.worker.proc.pid, signal.SIGSTOP)
    try:
        ckpt.save(2, state)
        t0 = time.monotonic()
        with pytest.raises(
            CheckpointError, match=r"made no progress for \d+ s \(storage.worker_stall_timeout_s=3\)"
        ):
            ckpt._wait_pending()
        assert 3.0 <= time.monotonic() - t0 < 30
    finally:
        ckpt.worker.proc.kill()
    assert ckpt.committed == [1] and list(ckpt.failed) == [2]
    assert [s for s, e in ckpt.drain() if e] == [2]
    status = json.loads((tmp_path / "run" / "checkpoint_status.json").read_text())
    assert status["committed_step"] == 1 and status["failed_saves"] == 1, status


def test_a_rebuilds_worker_spawns_only_when_started_or_needed(tmp_path: Path) -> None:
    """An in-process recovery's rebuild defers its worker (its start stalled
    the first resumed step): no process until start_worker() or a save, then
    SCHED_IDLE from the spawn; a finalize before either spawns none."""
    import torch
    from ckpt_drill import build_model

    from launcher.config.schema import ClusterConfig, RunConfig
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from train.checkpoint import CheckpointManager
    from train.loop.state import ModelState, OptimState
    from train.parallel.dist import DistInfo

    cfg = RunConfig(cluster=ClusterConfig(local_processes=1))
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path / "run"), run_id="worker-test-0006")
    info = DistInfo(0, 1, 0, 1, 0, "cpu", "gloo", "127.0.0.1", 0)

    unused = CheckpointManager(spec, info, deferred_worker=True)
    report = unused.finalize()
    assert report["commit_done"] and report["uploads_done"], report
    assert not unused.worker.started and unused.worker.proc.pid is None

    started = CheckpointManager(spec, info, deferred_worker=True)
    started.start_worker()
    pid = started.worker.proc.pid
    assert os.sched_getscheduler(pid) == os.SCHED_IDLE  # before its serve() lowers it
    started.start_worker()
    assert started.worker.proc.pid == pid and started.finalize()["commit_done"]

    saving = CheckpointManager(spec, info, deferred_worker=True)
    model = build_model(32, 2, 1)
    opt = torch.optim.AdamW(model.parameters())
    saving.save(3, {"model": ModelState([model]), "optim": OptimState([model], [opt])})
    assert saving.worker.started
    saving._wait_pending()
    assert saving.poll() == [(3, "")]
    assert saving.finalize()["commit_done"] and not saving.worker.proc.is_alive()
