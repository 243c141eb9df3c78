"""The one test harness: what tests of every tier share, instead of copying it
or importing it from another test module (tests/conftest.py puts tests/ on
the path; no test module imports another).

- paths: ``REPO``, ``TESTS``, ``PROGRAMS``, ``TOY`` (the plain DDP program);
- meshrun as a subprocess: ``launch(*overrides, run_dir=, cwd=, env=, check=)``
  (``env`` laid over os.environ, None unsets), ``launch_in(run_dir, ...)``,
  ``trained`` (must exit 0), ``dry_run`` (``WIDE`` tables), ``cli`` (from any
  cwd), ``launch_toy`` (``job=script`` of ``TOY``), ``fake_sbatch_cli`` (a
  fake sbatch on PATH) with ``assert_refused``; ``run_test_sh`` and
  ``one_cannot_line`` (scripts/test.sh, the one test command);
- configs in process: ``refused`` (a ConfigError's message), ``script_cfg``,
  ``spec_of`` (a ``job=script`` config / RunSpec);
- the test cluster: ``cluster_base(time_limit_min)`` (a small job's
  overrides), ``submit`` (launch, assert, job id), ``job_id_from``,
  ``wait_job`` (sacct's final record), ``wait_jobs`` (all ended);
- heartbeats of a run: ``beat_where``, ``heartbeat_at``, ``resumed_beat``;
- run readers: ``metrics``, ``losses``, ``loss_history``, ``step_records``,
  ``records_by_step``, ``events``, ``last_step``, ``wait_step``, ``result``;
- this machine: ``free_port``, ``s3_env``; test data: ``write_images`` (a
  small JPEG class tree), ``poisoned_ledger`` (hostile bad-node ledger lines).

Kept apart, each cohesive: the test cluster's paths, image and skip
(testcluster_util.py), the loopback S3 server (loopback_s3.py), the tiny HF
checkpoints and token files (jobs_util.py), the third-party programs' venvs
and faults (thirdparty_util.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
PROGRAMS = TESTS / "programs"
TOY = PROGRAMS / "ddp_toy.py"

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY")
# sacct states of a job that is still Slurm's (wait_job waits on through them).
NOT_ENDED = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED",
             "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT")  # fmt: skip


def _env(env: Mapping[str, str | None] | None) -> dict[str, str] | None:
    """``env`` over os.environ (a None value unsets the name); None: inherit."""
    if env is None:
        return None
    full = dict(os.environ)
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    return full


# The smallest Llama the trainer builds: a life is mostly process start-up.
TINY_MODEL = (
    "model=tiny",
    "model.dim=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.n_kv_heads=1",
    "model.ffn_dim=64",
    "model.seq_len=16",
)


def launch(
    *overrides: str,
    run_dir: Path | str | None = None,
    cwd: Path | str = REPO,
    env: Mapping[str, str | None] | None = None,
    timeout: float = 300,
    check: bool = False,
    **kw: Any,
) -> subprocess.CompletedProcess[str]:
    """``python -m launcher [launcher.run_dir=RUN_DIR] OVERRIDES`` in ``cwd``,
    output captured as text; ``env`` is laid over os.environ (None unsets a
    name); ``check``: assert it exited 0, showing the output's ends."""
    argv = [sys.executable, "-m", "launcher"]
    if run_dir is not None:
        argv.append(f"launcher.run_dir={run_dir}")
    proc = subprocess.run(
        [*argv, *overrides], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env(env), **kw
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | str = REPO, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m launcher ARGS`` importing this checkout from any ``cwd`` (PYTHONPATH=REPO)."""
    return launch(*args, cwd=cwd, env={"PYTHONPATH": str(REPO), **(env or {})}, timeout=timeout)


def launch_in(run_dir: Path | str, *overrides: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``launch`` of a local run in ``run_dir`` (keywords as ``launch``'s)."""
    return launch(*overrides, run_dir=run_dir, **kw)


def trained(run_dir: Path | str, *overrides: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``launch_in`` that must exit 0."""
    return launch(*overrides, run_dir=run_dir, check=True, **kw)


FAKE_SBATCH = """#!/bin/bash
echo "$@" >> "{calls}"
{body}
"""


def fake_sbatch_cli(
    tmp_path: Path,
    *args: str,
    sbatch: str = "exit 0",
    env: dict[str, str] | None = None,
    unset: list[str] = (),  # type: ignore[assignment]
    timeout: int = 120,
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """``python -m launcher ARGS`` in an empty dir with a fake sbatch (running
    ``sbatch``'s body, recording its arguments) and an empty squeue first on
    PATH: (process, working dir, sbatch calls file)."""
    cwd, bindir = tmp_path / "cwd", tmp_path / "bin"
    cwd.mkdir(exist_ok=True)
    bindir.mkdir(exist_ok=True)
    calls = tmp_path / "sbatch_calls"
    (bindir / "sbatch").write_text(FAKE_SBATCH.format(calls=calls, body=sbatch))
    (bindir / "squeue").write_text("#!/bin/bash\nexit 0\n")
    for f in ("sbatch", "squeue"):
        (bindir / f).chmod(0o755)
    full_env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", **(env or {})}
    for name in ["HYDRA_FULL_ERROR", *unset]:
        if name not in (env or {}):
            full_env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, cwd, calls


SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example key


def assert_refused(
    proc: subprocess.CompletedProcess[str], cwd: Path, calls: Path, code: int, expected: list[str]
) -> None:
    """A ``fake_sbatch_cli`` run refused: exit ``code``, each ``expected`` text
    said, no traceback, no ``SECRET``, nothing left in its dir, no sbatch call."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, (proc.returncode, out)
    for text in expected:
        assert text in out, (text, out)
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out, out
    assert "meshrun: error:" in proc.stderr or "meshrun: sweep" in proc.stdout, out
    assert SECRET not in out
    left = sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*"))
    assert left == [], f"left behind: {left}"
    assert not calls.exists(), f"sbatch was called: {calls.read_text()}"


WIDE = {"COLUMNS": "400"}  # for launch(env=...): a dry run's tables on one line a row


def dry_run(run_dir: Path | str, *overrides: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``launch_in(run_dir, launcher.dry_run=true, ...)`` with ``WIDE`` columns."""
    return launch(*("launcher.dry_run=true", *overrides), run_dir=run_dir, env=WIDE, **kw)


def launch_toy(
    *overrides: str, run_dir: Path, cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m launcher job=script`` of the plain DDP program (tests/programs/ddp_toy.py)."""
    argv = ["-m", "launcher", "job=script", f"job.script={TOY}", *overrides, f"launcher.run_dir={run_dir}"]
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def run_test_sh(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``bash scripts/test.sh ARGS`` (the one test command) with no MESHRUN_TEST_* of this shell but ``env``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("MESHRUN_TEST_")}
    full.update(env, PYTHONPATH=str(REPO))
    return subprocess.run(
        ["bash", "scripts/test.sh", *args], cwd=REPO, env=full, capture_output=True, text=True, timeout=300
    )


def one_cannot_line(out: str) -> str:
    """scripts/test.sh's one line of what cannot run here (asserted to be one)."""
    lines = [line for line in out.splitlines() if "cannot run here" in line or "every test can run" in line]
    assert len(lines) == 1, out
    return lines[0]


# --- configs, in process -------------------------------------------------
def refused(overrides: list[str], cfg_edit: Callable[[Any], None] | None = None) -> str:
    """The message of the ConfigError that compose(overrides) (+ ``cfg_edit``) + make_plan raise."""
    import pytest

    from launcher.config.compose import compose
    from launcher.config.validate import ConfigError
    from launcher.plan.make import make_plan

    with pytest.raises(ConfigError) as info:
        cfg = compose(overrides)
        if cfg_edit:
            cfg_edit(cfg)
        make_plan(cfg)
    return str(info.value)


def script_cfg(*overrides: str, script: str | None = str(TOY)):  # type: ignore[no-untyped-def]
    """The composed config of ``job=script`` (of ``TOY`` unless ``script`` says otherwise)."""
    from launcher.config.compose import compose

    return compose(["job=script", *([f"job.script={script}"] if script else []), *overrides])


def spec_of(tmp_path: Path, *overrides: str, script: str | None = str(TOY)):  # type: ignore[no-untyped-def]
    """A ``job=script`` RunSpec with its run dir written under ``tmp_path/run``."""
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.run.rundir import write_run_dir

    cfg = script_cfg(*overrides, script=script)
    spec = RunSpec(cfg, make_plan(cfg), str(tmp_path / "run"))
    write_run_dir(spec)
    return spec


# --- the local Slurm test cluster ------------------------------------------
def start_local_run(run_dir: Path, *overrides: str, cwd: Path) -> subprocess.Popen:
    """``python -m launcher`` of a local run in the background, in its own
    session (killable as a group), its output in ``<run_dir>.out``; no rank
    or meshrun variable of this process reaches it."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MESHRUN_"))
    }
    env.update(
        PYTHONPATH=str(Path(__file__).resolve().parents[1]), OMP_NUM_THREADS="1", TMPDIR=str(run_dir.parent)
    )
    out = open(f"{run_dir}.out", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "launcher", f"launcher.run_dir={run_dir}", f"hydra.run.dir={run_dir}/hydra",
         *overrides],
        env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
    )  # fmt: skip


def cluster_base(time_limit_min: int = 3) -> list[str]:
    """A small job on the test cluster: tiny model, shared nodes, a short QOS limit."""
    return [
        "cluster=testcluster",
        "model=tiny",
        "launcher.exclusive=false",
        f"qos.time_limit_min={time_limit_min}",
        "launcher.signal_lead_s=30",
    ]


def job_id_from(out: str) -> str:
    for line in out.splitlines():
        if line.startswith("meshrun: submitted job "):
            return line.split()[3].rstrip(":")
    raise AssertionError(f"no job id in output:\n{out}")


def submit(*overrides: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 90) -> str:
    """Launch to Slurm, assert it was accepted; the job id."""
    out = launch(*overrides, cwd=cwd, env=env or {}, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return job_id_from(out.stdout)


# How often the job waits ask squeue: a job's end is seen this late on
# average (at 2 s, a second per wait over some 40 waits a CI run); one
# squeue call is ~10 ms (sacct, asked less often, ~100 ms).
POLL_S = 0.5


def wait_job(job: str, timeout: float) -> dict[str, str]:
    """sacct's final record of ``job`` once it ended: {"state", "nodes"}."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        q = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30
        )
        if not q.stdout.strip():
            out = subprocess.run(
                ["sacct", "-X", "-n", "-P", "-j", job, "-o", "State,NodeList"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.splitlines()
            if out:  # the last record: a job resized by a node failure has a RESIZING one first
                state, nodes = out[-1].split("|")
                # A requeue leaves squeue for a moment (REQUEUED, then PENDING again): not an end.
                if state.split()[0] not in NOT_ENDED:
                    return {"state": state.split()[0], "nodes": nodes}
        time.sleep(POLL_S)
    raise AssertionError(f"job {job} not finished after {timeout} s")


def wait_jobs(ids: list[str], timeout: float, done: tuple[str, ...] = ENDED):  # type: ignore[no-untyped-def]
    """launcher.slurm.cluster.jobs(ids) once every job is in a ``done`` state."""
    from launcher.slurm.cluster import jobs

    # sacct (slurmdbd) judges, asked every 2 s as always and at each poll
    # for a few seconds after squeue's rows for the jobs change (an end, a
    # requeue): squeue is the cheap signal, sacct's record may lag it.
    deadline = time.monotonic() + timeout
    seen, ask_until, asked = None, 0.0, 0.0
    while time.monotonic() < deadline:
        rows = subprocess.run(
            ["squeue", "-h", "-j", ",".join(ids), "-o", "%i %T"], capture_output=True, text=True, timeout=30
        ).stdout
        now = time.monotonic()
        if rows != seen:
            seen, ask_until = rows, now + 3
        if now < ask_until or now - asked >= 2:
            asked = now
            recs = jobs(ids)
            if len(recs) == len(ids) and all(r.state in done for r in recs.values()):
                return recs
        time.sleep(POLL_S)
    raise AssertionError(f"jobs {ids} not finished after {timeout} s: {jobs(ids)}")


# --- heartbeats ----------------------------------------------------------
def beat_where(run_dir: Path, rank: int, pred: Callable[[dict], bool], timeout: float, what: str) -> dict:
    """The rank's own (node-local) heartbeat, in any node's dir, once ``pred``
    holds for it (each node keeps its own file: a stale one is skipped); else
    fail with ``what``."""
    from launcher.config.health import local_heartbeat_dir

    pattern = local_heartbeat_dir(run_dir, "*", job="*")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in pattern.parent.glob(f"{pattern.name}/rank{rank}.json"):
            try:
                h = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if pred(h):
                return h
        time.sleep(0.05)
    raise AssertionError(what)


def heartbeat_at(run_dir: Path, rank: int, step: int, timeout: float = 150) -> dict:
    """The rank's heartbeat once it reached ``step``: the test cluster's nodes
    share this host, and the node files lag by up to a second."""
    return beat_where(
        run_dir, rank, lambda h: h["phase"] == "step" and h["step"] >= step, timeout,
        f"rank {rank} never reached step {step}",
    )  # fmt: skip


def resumed_beat(run_dir: Path, rank: int, first_after: int, step_after: int, timeout: float) -> dict:
    """A rank's heartbeat from a process that started past step ``first_after``
    (a resumed one) and reached ``step_after`` steps past its first."""

    def resumed(h: dict) -> bool:
        first = h.get("first_step", 0)
        return h["phase"] == "step" and first > first_after and h["step"] >= first + step_after

    return beat_where(
        run_dir,
        rank,
        resumed,
        timeout,
        f"rank {rank}: no resumed process past step {first_after} in {timeout} s",
    )


# --- run readers ---------------------------------------------------------
def metrics(run_dir: Path) -> list[dict]:
    """Every record of the run's metrics.jsonl."""
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def loss_history(run_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) of each logged training step in order, re-runs after a restart included."""
    return [
        (int(r["step"]), float(r["loss"]))
        for r in metrics(run_dir)
        if "loss" in r and "step" in r and r.get("event") is None
    ]


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss of the logged training steps (the last record of a re-run step)."""
    return dict(loss_history(run_dir))


def events(run_dir: Path, name: str) -> list[dict]:
    """The run's ``{"event": name, ...}`` records."""
    return [r for r in metrics(run_dir) if r.get("event") == name]


def last_step(run_dir: Path) -> int:
    """The last logged training step; 0 before the first (or before metrics.jsonl)."""
    if not (Path(run_dir) / "metrics.jsonl").exists():
        return 0
    return max(losses(run_dir) or {0: 0})


def wait_step(run_dir: Path, step: int, timeout: float) -> None:
    """Until the run logged ``step`` (polling metrics.jsonl each second)."""
    deadline = time.monotonic() + timeout
    while last_step(run_dir) < step:
        assert time.monotonic() < deadline, f"{run_dir} did not reach step {step}"
        time.sleep(1)


def step_records(run_dir: Path) -> list[dict]:
    """The run's training-step records (those with a loss, no event), in order."""
    return [r for r in metrics(run_dir) if "loss" in r and "event" not in r]


def records_by_step(run_dir: Path) -> dict[int, dict]:
    """step -> the training-step record (the last of a re-run step)."""
    return {r["step"]: r for r in step_records(run_dir)}


def result(run_dir: Path) -> dict:
    """The run's result.json."""
    return json.loads((Path(run_dir) / "result.json").read_text())


# --- this machine --------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


INJECTED_NODE = "node1\ntouch /tmp/meshrun-pwned #"  # a node name that would run a command


def poisoned_ledger(path: Path, now: float) -> None:
    """A bad-node ledger at ``path``: node4 with two good faults; then lines
    another user of the runs root could write (bad names, times, a torn line)."""
    good = {"cause": "hang", "run": "r1", "job": "9", "detail": "no progress"}
    lines = [
        json.dumps({**good, "node": "node4", "time": now - 10}),
        json.dumps({**good, "node": "node3", "time": "yesterday"}),
        json.dumps({**good, "node": INJECTED_NODE, "time": now - 10}),
        json.dumps({**good, "node": "gpu[001-512]", "time": now - 10}),
        json.dumps({**good, "node": "node2,node3", "time": now - 10}),
        json.dumps({**good, "node": "-x", "time": now - 10}),
        json.dumps({**good, "node": "node3", "time": True}),
        '{"node": "node4", "ti',  # torn
        json.dumps({**good, "node": "node4", "time": now - 5, "run": "r2"}),
    ]
    path.write_text("\n".join(lines) + "\n")


def write_images(root: Path, classes: int = 3, per_class: int = 12, seed: int = 0) -> list[Path]:
    """Gradient JPEGs of varied sizes under ``root/classN/``; pixel (0, 0)
    encodes the image number so a batch can be traced back to its files."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    paths = []
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = (int(v) for v in rng.integers(40, 96, 2))
            yy, xx = np.mgrid[0:h, 0:w]
            arr = np.stack([(xx * 3 + 60 * c) % 256, (yy * 4 + 7 * i) % 256, ((xx + yy) * 2) % 256], -1)
            path = root / f"class{c}" / f"img{i:03d}.jpg"
            Image.fromarray(arr.astype(np.uint8)).save(path, quality=92)
            paths.append(path)
    return paths


def s3_env(access_key: str = "x", secret_key: str = "x") -> dict[str, str | None]:
    """For ``launch(env=...)``: every AWS_ name of this shell unset, the given keys set."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=access_key, AWS_SECRET_ACCESS_KEY=secret_key, AWS_DEFAULT_REGION="us-east-1")
    return env
