"""Slurm over SSH against the real test cluster: a real sshd on 127.0.0.1
(tests/ssh_server.py) whose sessions see the test cluster (SLURM_CONF) is
the login node; the laptop is a process with no Slurm command on its PATH
and no SLURM_CONF. From it: ``sbatch`` on the login node (a job name with
shell characters arrives as typed), ``meshrun status`` of a run dir made
with ``cluster.login`` shows the job from the login node's sacct, ``meshrun
cancel`` cancels it there, and this machine's Slurm agrees."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from harness import REPO, cluster_base, heartbeat_at, job_id_from, wait_job
from ssh_server import LaptopUser, SshServer, laptop_missing, laptop_user

from launcher.config.validate import Login, parse_login
from launcher.slurm import cluster, remote

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]

T = TypeVar("T")
HOSTILE_NAME = "meshrun ssh; $(touch /tmp/meshrun-ssh-pwned) 'q'"


@pytest.fixture
def laptop(login_node: SshServer) -> Iterator[dict[str, str]]:
    """The laptop's environment: the server's ssh wrapper and a few tools on
    PATH (no Slurm command), no SLURM_CONF, a private socket folder."""
    short = Path(tempfile.mkdtemp(prefix="msh", dir="/tmp"))
    (short / "bin").mkdir()
    for tool in ("sh", "env", "git"):
        os.symlink(shutil.which(tool) or f"/bin/{tool}", short / "bin" / tool)
    yield {
        "PATH": f"{login_node.bindir}:{short / 'bin'}",
        "SLURM_CONF": "",
        "XDG_RUNTIME_DIR": str(short),
        "XDG_CACHE_HOME": str(short / "cache"),  # the laptop's own code store
    }
    remote.close_connection(remote_login(login_node), control=short / f"meshrun-ssh-{os.getuid()}")
    shutil.rmtree(short, ignore_errors=True)


def remote_login(server: SshServer) -> Login:
    return parse_login(server.login)


def meshrun(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**full, **env, "PYTHONPATH": str(REPO)},
    )


def until(read: Callable[[], T], done: Callable[[T], bool], timeout: float = 60) -> T:
    """``read()`` again every second until ``done`` holds of it or ``timeout`` passes; its last value."""
    deadline = time.monotonic() + timeout
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(1)
        value = read()
    return value


def test_a_job_submitted_followed_and_cancelled_from_a_laptop_over_ssh(
    login_node: SshServer, laptop: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in laptop.items():  # this process is the laptop too
        monkeypatch.setenv(key, value)
    assert shutil.which("sbatch") is None and not os.environ.get("SLURM_CONF")
    remote.check_login_node(remote_login(login_node))  # it has Slurm
    out = cluster.run(
        ["sbatch", "--parsable", "-p", "research", "-A", "research", "-q", "research", "-t", "5",
         "-J", HOSTILE_NAME, "-o", "/dev/null", "--wrap", "sleep 300"],
        login=login_node.login,
    )  # fmt: skip
    job = out.stdout.strip().split(";")[0]
    assert job.isdigit(), out
    run = tmp_path / "run"
    (run / "slurm").mkdir(parents=True)
    spec = {"cfg": {"cluster": {"name": "testcluster", "kind": "slurm", "login": login_node.login}}}
    (run / "spec.json").write_text(json.dumps(spec))
    (run / "slurm" / "job.json").write_text(f'{{"job_id": "{job}"}}')
    # status reads sacct: slurmdbd may list a job only a moment after sbatch.
    shown = until(
        lambda: meshrun("status", str(run), env=laptop),
        lambda p: "PENDING" in p.stdout or "RUNNING" in p.stdout,
    )
    assert shown.returncode == 0, shown.stderr
    row = shown.stdout.splitlines()[1].split()
    assert job in row and ({"PENDING", "RUNNING"} & set(row)), shown.stdout
    cancelled = meshrun("cancel", str(run), env=laptop)
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"(job {job})" in cancelled.stdout
    monkeypatch.undo()  # this machine's Slurm again, to check what the login node did
    assert wait_job(job, 60)["state"] == "CANCELLED"
    sacct = ["sacct", "-X", "-n", "-P", "-j", job, "-o", "JobName"]
    # slurmdbd may not have the job's record yet: sacct says "allocation" until it does.
    name = until(
        lambda: subprocess.run(sacct, capture_output=True, text=True, timeout=30).stdout.strip(),
        lambda n: n not in ("", "allocation"),
    )
    assert name == HOSTILE_NAME and not Path("/tmp/meshrun-ssh-pwned").exists()
    # sacct's CANCELLED reaches meshrun status from the laptop too.
    shown = until(lambda: meshrun("status", str(run), env=laptop), lambda p: "CANCELLED" in p.stdout, 30)
    assert "CANCELLED" in shown.stdout, shown.stdout + shown.stderr


def test_a_dry_run_from_a_laptop_is_answered_by_the_login_nodes_slurm(
    login_node: SshServer, laptop: dict[str, str], tmp_path: Path
) -> None:
    def dry(*overrides: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "launcher", *cluster_base(), f"cluster.login={login_node.login}",
             f"launcher.run_dir={tmp_path / 'run'}", "launcher.dry_run=true", *overrides],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")}, **laptop,
                 "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    out = dry()
    said = [ln for ln in out.splitlines() if ln.startswith("meshrun: sbatch --test-only: ")]
    assert len(said) == 1 and "to start" in said[0], out[-3000:]
    out = dry("qos.partition=nosuch")
    assert "a submission here would be refused: qos.partition='nosuch' is invalid: no such partition" in out
    assert "research" in out.split("no such partition")[1]  # the login node's partitions named
    assert not (tmp_path / "run").exists()


def test_a_run_submitted_from_a_laptop_completes_heals_and_its_code_travels_once(
    login_node: SshServer, tmp_path: Path
) -> None:
    """The laptop is another Unix user with its own key, its own Python
    (Debian's) and its own copy of the project, and a preset only it has.
    From it: the Python API submits (the code and presets shipped, meshrun
    run on the login node with the cluster's Python), waits, and reads the
    result and logs there, while a task of the run is SIGKILLed on the
    cluster and the run heals in its allocation as on the login node;
    `meshrun status` / `logs` / `cancel` LOGIN:DIR read it there; the same
    tree again (a 3-point sweep through `python -m launcher -m`) sends no
    file; a held pipeline is submitted and cancelled."""
    why = laptop_missing()
    if why:
        pytest.skip(why)  # under CI a skip fails (tests/conftest.py)
    runs = tmp_path / "cluster-runs"  # the cluster's runs root (here: the same disk)
    with laptop_user(login_node, REPO) as laptop:
        # The laptop's own preset (as `meshrun init` writes it): only the laptop has it.
        presets = laptop.home / "conf"
        (presets / "cluster").mkdir(parents=True)
        preset = (
            (REPO / "conf" / "cluster" / "testcluster.yaml")
            .read_text()
            .replace("name: testcluster", "name: sshcluster")
        )
        (presets / "cluster" / "sshcluster.yaml").write_text(
            f"{preset}\nlogin: {login_node.login}\npython: {sys.executable}\n"
        )
        subprocess.run(["chown", "-R", f"{laptop.name}:", str(presets)], check=True)
        laptop.env["MESHRUN_CONFIG_DIR"] = str(presets)
        _from_the_laptop(login_node, laptop, runs)


def _from_the_laptop(login_node: SshServer, laptop: LaptopUser, runs: Path) -> None:
    py = laptop.python
    base = ["cluster=sshcluster", *cluster_base(time_limit_min=5)[1:], "cluster.nodes=1",
            "cluster.gpus_per_node=2", "train.steps=3", f"launcher.runs_root={runs}"]  # fmt: skip
    # The Python API from the laptop: submit, wait, result, logs (each asked on
    # the login node); a task SIGKILLed meanwhile heals on the spare.
    steps = 16
    heal = [*base, f"train.steps={steps}", "cluster.spare_nodes=1", "storage.save_every_steps=4",
            "train.log_every_steps=1", f"launcher.run_dir={runs / 'first'}"]  # fmt: skip
    api_script = f"""
import json
from launcher import api
run = api.submit({heal!r})
print("HANDLE", type(run).__name__, run.job_id, flush=True)
print("STATE", run.wait(timeout_s=240, poll_s=2).state)
print("RESULT", json.dumps(run.result()))
print("LOGS", "done: step {steps}" in run.logs(0, 5))
"""
    waiting = laptop.popen(py, "-c", api_script)
    beat, deadline = None, time.monotonic() + 180
    while beat is None and waiting.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(AssertionError):
            beat = heartbeat_at(runs / "first", 1, 6, timeout=2)
    if beat is None:
        waiting.kill()
        out, err = waiting.communicate()
        raise AssertionError(f"the run never reached step 6:\n{out[-3000:]}\n{err[-3000:]}")
    os.kill(beat["pid"], signal.SIGKILL)  # on the cluster: the run is there
    try:
        out, err = waiting.communicate(timeout=300)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, out[-3000:] + err[-3000:]
    job = job_id_from(out)
    said = dict(ln.split(" ", 1) for ln in out.splitlines() if ln.split(" ")[0].isupper())
    assert said["HANDLE"] == f"RemoteRun {job}" and said["STATE"] == "COMPLETED", out
    assert json.loads(said["RESULT"])["final_step"] == steps and said["LOGS"] == "True", out
    shipped = [ln for ln in out.splitlines() if ln.startswith("meshrun: submitted over SSH to ")]
    assert len(shipped) == 1 and " files, " in shipped[0] and "MB sent)" in shipped[0], out
    assert f"meshrun: follow it from here: meshrun status {login_node.login}:{runs / 'first'}" in out
    # Healed as on the login node: the kill restarted in the allocation on the spare.
    faults = [json.loads(x) for x in (runs / "first" / "faults.jsonl").read_text().splitlines()]
    assert faults[0]["cause"] == "signal" and faults[0]["action"] == "restart", faults
    resumed = [f for f in faults if f.get("event") == "resumed"]
    assert len(resumed) == 1 and resumed[0]["job"] == job, faults
    # The record (written on the login node) says where the submission came from.
    rec = json.loads((runs / "first" / "run_record.json").read_text())
    assert rec["submitted_from"] == {"user": laptop.name, "host": socket.gethostname(), "over": "ssh"}
    assert rec["config"]["cluster"]["login"] == ""  # there, Slurm is local
    assert rec["code"]["dir"].startswith(str(runs / ".code")), rec["code"]
    assert rec["config"]["cluster"]["name"] == "sshcluster"  # the laptop's preset composed there
    assert " your presets " in shipped[0], shipped
    # meshrun status and logs from the laptop read it on the login node.
    first_target = f"{login_node.login}:{runs / 'first'}"
    shown = laptop.run(py, "-m", "launcher.cli", "status", first_target)
    assert shown.returncode == 0 and job in shown.stdout and "COMPLETED" in shown.stdout, (
        shown.stdout + shown.stderr
    )
    logs = laptop.run(py, "-m", "launcher.cli", "logs", first_target)
    assert logs.returncode == 0 and f" job {job}, rank 0 of 2" in logs.stdout, logs.stdout + logs.stderr
    assert f"done: step {steps}" in logs.stdout, logs.stdout
    # The same tree again, after a job ran from it, as a 3-point sweep: nothing
    # sent, one job array there; cancelled from the laptop.
    sweep = laptop.run(
        py, "-m", "launcher", "-m", *base, "train.steps=2,3,4", f"hydra.sweep.dir={runs / 'sweep'}"
    )
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    assert "(already there, nothing sent)" in sweep.stdout, sweep.stdout
    assert "meshrun: sweep of 3: 3 submitted in 1 job array(s)" in sweep.stdout, sweep.stdout
    manifest = json.loads((runs / "sweep" / "manifest.json").read_text())
    jobs = [p["job_id"] for p in manifest["points"]]
    assert [p["status"] for p in manifest["points"]] == ["submitted"] * 3, manifest
    cancelled = laptop.run(py, "-m", "launcher.cli", "cancel", f"{login_node.login}:{runs / 'sweep'}")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert all(f"(job {j})" in cancelled.stdout for j in jobs), cancelled.stdout
    # A pipeline (held, two stages, the second after the first) submitted there; cancelled from here.
    pipe_file = laptop.home / "pipe.yaml"
    pipe_file.write_text(
        json.dumps({"overrides": [*base, "launcher.hold=true"],
                    "stages": {"a": {"overrides": []}, "b": {"overrides": [], "depends_on": ["a"]}}})
    )  # fmt: skip
    pipe = laptop.run(py, "-m", "launcher.pipeline", str(pipe_file), "--dir", str(runs / "pipe"))
    assert pipe.returncode == 0, pipe.stdout[-3000:] + pipe.stderr[-3000:]
    assert "meshrun: pipeline of 2 stage(s) submitted: a (job " in pipe.stdout, pipe.stdout
    stages = json.loads((runs / "pipe" / "pipeline.json").read_text())["stages"]
    assert stages[1]["depends_on"] == str(runs / "pipe" / "a"), stages
    cancelled = laptop.run(py, "-m", "launcher.cli", "cancel", f"{login_node.login}:{runs / 'pipe'}")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert all(f"(job {s['job_id']})" in cancelled.stdout for s in stages), cancelled.stdout
    assert not (laptop.home / ".cache" / "meshrun" / "ssh" / "first").exists()  # no run dir there
