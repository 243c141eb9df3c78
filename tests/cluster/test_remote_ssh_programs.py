"""A team's own programs submitted from a laptop over SSH to the real test
cluster: a real sshd on 127.0.0.1 (tests/ssh_server.py) whose sessions see
the test cluster is the login node; the laptop is a process with no Slurm
command on its PATH and no SLURM_CONF. A plain DDP program
(tests/programs/ddp_toy.py) in a project dir with a credential file beside
it runs as job=script from the project shipped there: it completes, the
record names the project digest the laptop's snapshot has (and the laptop's
paths), the credential never left the laptop, and the same tree again sends
no file. A Hydra app's 2-point sweep (tests/programs/hydra_app.py) through
hydra/launcher=meshrun_slurm returns at once with one job array submitted
there (cancelled from the laptop)."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import REPO, job_id_from, wait_job
from ssh_server import SshServer

from launcher.config.validate import parse_login
from launcher.slurm import remote

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]
PROGRAMS = REPO / "tests" / "programs"


@pytest.fixture
def laptop(login_node: SshServer) -> Iterator[dict[str, str]]:
    """The laptop's environment: the server's ssh wrapper and a few tools on
    PATH (no Slurm command), no SLURM_CONF, its own code store."""
    short = Path(tempfile.mkdtemp(prefix="msh", dir="/tmp"))
    (short / "bin").mkdir()
    for tool in ("sh", "env", "git"):
        os.symlink(shutil.which(tool) or f"/bin/{tool}", short / "bin" / tool)
    env = {"PATH": f"{login_node.bindir}:{short / 'bin'}", "SLURM_CONF": "", "XDG_RUNTIME_DIR": str(short),
           "XDG_CACHE_HOME": str(short / "cache")}  # fmt: skip
    yield {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")}, **env,
           "PYTHONPATH": str(REPO)}  # fmt: skip
    remote.close_connection(parse_login(login_node.login), control=short / f"meshrun-ssh-{os.getuid()}")
    shutil.rmtree(short, ignore_errors=True)


def on_laptop(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=cwd, env=env)


def laptop_digests(env: dict[str, str], source: Path) -> set[str]:
    """The project digests of the laptop's own snapshots of ``source`` (its code store)."""
    store = Path(env["XDG_CACHE_HOME"]) / "meshrun" / "ssh" / ".code" / getpass.getuser()
    metas = [json.loads(p.read_text()) for p in store.glob("*/snapshot.json")]
    return {m["digest"] for m in metas if m["kind"] == "project" and m["source"] == str(source)}


def test_a_plain_program_from_a_laptop_runs_from_its_shipped_project(
    login_node: SshServer, laptop: dict[str, str], tmp_path: Path
) -> None:
    runs = tmp_path / "cluster-runs"  # the cluster's runs root (here: the same disk)
    project = tmp_path / "laptop" / "proj"
    project.mkdir(parents=True)
    shutil.copy(PROGRAMS / "ddp_toy.py", project / "train.py")
    (project / ".env").write_text("WANDB_API_KEY=laptop-secret\n")  # a credential: never shipped
    typed = ["cluster=testcluster", "job=script", "job.script=train.py", "job.args=[--steps,3,--save-every,2]",
             "cluster.nodes=1", "cluster.gpus_per_node=2", "launcher.exclusive=false", "qos.time_limit_min=3",
             "launcher.signal_lead_s=30", f"launcher.runs_root={runs}", f"cluster.login={login_node.login}",
             f"cluster.python={sys.executable}"]  # fmt: skip
    first = on_laptop(
        [sys.executable, "-m", "launcher", *typed, f"launcher.run_dir={runs / 'ddp'}"], project, laptop
    )
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    job = job_id_from(first.stdout)
    (digest,) = laptop_digests(laptop, project)
    shipped = [ln for ln in first.stdout.splitlines() if ln.startswith("meshrun: submitted over SSH to ")]
    assert len(shipped) == 1 and f"; project {digest[:16]} in " in shipped[0] and "MB sent)" in shipped[0]
    # The same tree again (held, then cancelled here): no file sent.
    again = on_laptop(
        [sys.executable, "-m", "launcher", *typed, f"launcher.run_dir={runs / 'ddp2'}", "launcher.hold=true"],
        project,
        laptop,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "(already there, nothing sent)" in again.stdout, again.stdout
    subprocess.run(["scancel", job_id_from(again.stdout)], check=True, timeout=30)
    state = wait_job(job, 180)["state"]
    assert state == "COMPLETED", (runs / "ddp" / "slurm" / f"{job}_0_log.err").read_text()[-3000:]
    assert json.loads((runs / "ddp" / "result.json").read_text())["final_step"] == 3
    rec = json.loads((runs / "ddp" / "run_record.json").read_text())
    there = rec["config"]["job"]["workdir"]
    # The project on the cluster is the shipped entry, its digest the laptop's; the record says both paths.
    assert rec["code"]["project"]["digest"] == digest and rec["code"]["project"]["dir"] == there, rec["code"]
    assert there == f"{runs}/.code/{getpass.getuser()}/{digest}/project"
    assert rec["config"]["job"]["script"] == f"{there}/train.py"
    came = rec["submitted_from"]
    assert (came["workdir"], came["script"]) == (str(project), str(project / "train.py")), came
    assert "job.script=train.py" in came["overrides"] and f"job.workdir='{there}'" in rec["overrides"]
    assert not Path(there, ".env").exists() and sorted(os.listdir(there)) == ["train.py"]


def test_a_hydra_apps_sweep_from_a_laptop_is_submitted_over_ssh_and_returns_at_once(
    login_node: SshServer, laptop: dict[str, str], tmp_path: Path
) -> None:
    runs = tmp_path / "cluster-runs"
    app = tmp_path / "laptop" / "app"
    app.mkdir(parents=True)
    shutil.copy(PROGRAMS / "hydra_app.py", app / "app.py")
    cmd = [sys.executable, "app.py", "-m", "+x=2,3", "hydra.job.chdir=true",
           "hydra/launcher=meshrun_slurm", "hydra.launcher.cluster=testcluster", "hydra.launcher.timeout_min=3",
           "hydra.launcher.wait=false", f"hydra.launcher.login={login_node.login}",
           f'hydra.launcher.overrides=["launcher.runs_root={runs}","cluster.python={sys.executable}"]']  # fmt: skip
    # Refused on the login node (a partition it does not have): one line here, nothing left there.
    refused = on_laptop([*cmd[:-1], cmd[-1].replace('"]', '","qos.partition=nosuch"]')], app, laptop)
    assert refused.returncode == 1, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert "qos.partition='nosuch' is invalid" in refused.stderr and "Traceback" not in refused.stderr
    assert not (runs / "sweeps").exists() or not any((runs / "sweeps").iterdir())
    out = on_laptop(cmd, app, laptop)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    said = [ln for ln in log.splitlines() if "meshrun_slurm: submitted over SSH to " in ln]
    assert len(said) == 1, log[-3000:]
    sweep = Path(said[0].split(f"meshrun status {login_node.login}:")[1].strip())
    assert sweep.parent == runs / "sweeps", said
    manifest = json.loads((sweep / "manifest.json").read_text())
    jobs = [p["job_id"] for p in manifest["points"]]
    assert [p["run_dir"] for p in manifest["points"]] == [str(sweep / "0"), str(sweep / "1")], manifest
    assert [p["status"] for p in manifest["points"]] == ["submitted"] * 2, manifest
    assert len({j.split("_")[0] for j in jobs}) == 1, jobs  # one job array
    rec = json.loads((sweep / "0" / "run_record.json").read_text())
    assert rec["submitted_from"]["workdir"] == str(app), rec["submitted_from"]
    assert rec["code"]["project"]["dir"].startswith(f"{runs}/.code/"), rec["code"]
    # The project run there is one the laptop snapshotted (the refused sweep's multirun.yaml,
    # which Hydra writes into the app's dir here, makes the two trees differ).
    digest = rec["code"]["project"]["digest"]
    assert digest in laptop_digests(laptop, app) and f"project {digest[:16]})" in said[0], said
    # Each point runs the app's function from the shipped project: its job dir is the run dir there.
    for n, job in enumerate(jobs):
        state = wait_job(job, 180)["state"]
        assert state == "COMPLETED", sorted(os.listdir(sweep / "slurm"))
        assert (sweep / str(n) / "answer.txt").read_text() == f"{(n + 2) ** 2}\n"
