"""Sweeps, reruns and diffs of runs on the real test cluster, from a laptop
over SSH: a real sshd on 127.0.0.1 (tests/ssh_server.py) whose sessions see
the test cluster is the login node; the laptop is a process with no Slurm
command on its PATH and no SLURM_CONF, with a preset only it has."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import REPO, cluster_base, free_port, job_id_from
from ssh_server import SshServer

from launcher.config.validate import parse_login
from launcher.slurm import remote

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]

HOSTILE = "launcher.job_name='re run; $(touch /tmp/meshrun-ssh-pwned) q'"


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
    remote.close_connection(parse_login(login_node.login), control=short / f"meshrun-ssh-{os.getuid()}")
    shutil.rmtree(short, ignore_errors=True)


def test_a_sweep_rerun_and_diff_from_a_laptop_run_on_the_cluster(
    login_node: SshServer, laptop: dict[str, str], tmp_path: Path
) -> None:
    """The Python API's sweep over SSH returns a RemoteRun per point that
    waits and reads results there; ``meshrun rerun LOGIN:DIR`` reruns a
    point there with its recorded code and the laptop's preset, a hostile
    override arriving as typed; ``meshrun diff`` of two runs there names the
    change; one here and one there is refused in one line."""
    runs = tmp_path / "cluster-runs"  # the cluster's runs root (here: the same disk)
    presets = Path(laptop["XDG_RUNTIME_DIR"]) / "conf"
    (presets / "cluster").mkdir(parents=True)
    preset = (
        (REPO / "conf/cluster/testcluster.yaml").read_text().replace("name: testcluster", "name: sshcluster")
    )
    (presets / "cluster" / "sshcluster.yaml").write_text(
        f"{preset}\nlogin: {login_node.login}\npython: {sys.executable}\n"
    )
    base = ["cluster=sshcluster", *cluster_base()[1:], "cluster.nodes=1", "cluster.gpus_per_node=1",
            f"launcher.runs_root={runs}"]  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")}, **laptop,
           "MESHRUN_CONFIG_DIR": str(presets), "PYTHONPATH": str(REPO)}  # fmt: skip

    def laptop_python(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv], capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env
        )

    api_script = f"""
import json
from launcher import api
runs = api.sweep({[*base, "train.steps=2,3"]!r})
print("HANDLES", json.dumps([[type(r).__name__, r.run_dir, r.job_id] for r in runs]))
print("STATES", json.dumps([r.wait(timeout_s=150, poll_s=2).state for r in runs]))
print("STEPS", json.dumps([r.result()["final_step"] for r in runs]))
"""
    swept = laptop_python("-c", api_script)
    assert swept.returncode == 0, swept.stdout[-3000:] + swept.stderr[-3000:]
    said = dict(ln.split(" ", 1) for ln in swept.stdout.splitlines() if ln.split(" ")[0].isupper())
    handles = json.loads(said["HANDLES"])
    assert [h[0] for h in handles] == ["RemoteRun", "RemoteRun"], handles
    assert all(h[1].startswith(f"{runs}/sweeps/") and h[2] for h in handles), handles
    assert json.loads(said["STATES"]) == ["COMPLETED", "COMPLETED"] and json.loads(said["STEPS"]) == [2, 3]
    first = handles[0][1]

    # The rerun, from the laptop: point 0 with 3 steps, a job name a shell would read.
    t0 = time.monotonic()
    again = laptop_python(
        "-m", "launcher.cli", "rerun", f"{login_node.login}:{first}", "train.steps=3", HOSTILE
    )
    rerun_s = time.monotonic() - t0
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    follow = [ln for ln in again.stdout.splitlines() if "follow it from here: meshrun status " in ln]
    assert len(follow) == 1 and f"meshrun status {login_node.login}:{runs}/" in follow[0], again.stdout
    new, job = follow[0].rsplit(":", 1)[1], job_id_from(again.stdout)
    assert f"meshrun: rerun of {first} with the code in " in again.stdout  # the login node's output here
    rec = json.loads(Path(new, "run_record.json").read_text())
    old = json.loads(Path(first, "run_record.json").read_text())
    assert rec["overrides"][-2:] == ["train.steps=3", HOSTILE], rec["overrides"]
    assert rec["config"]["launcher"]["job_name"] == "re run; $(touch /tmp/meshrun-ssh-pwned) q"
    assert rec["config"]["cluster"]["name"] == "sshcluster"  # the laptop's preset, shipped for the rerun
    assert rec["code"]["digest"] == old["code"]["digest"], (rec["code"], old["code"])
    assert rec["submitted_from"]["over"] == "ssh" and not Path("/tmp/meshrun-ssh-pwned").exists()
    print(f"rerun over SSH, submitted in {rerun_s:.1f} s")

    # Two runs there: compared there; one here and one there: refused in one line.
    compared = laptop_python(
        "-m",
        "launcher.cli",
        "diff",
        "--no-code-diff",
        f"{login_node.login}:{first}",
        f"{login_node.login}:{new}",
    )
    assert compared.returncode == 1, compared.stdout[-3000:] + compared.stderr[-3000:]
    assert "train.steps" in compared.stdout and "job_name" in compared.stdout, compared.stdout
    mixed = laptop_python("-m", "launcher.cli", "diff", f"{login_node.login}:{first}", str(tmp_path))
    assert mixed.returncode == 2 and len(mixed.stderr.strip().splitlines()) == 1, mixed.stderr
    assert mixed.stderr.startswith("meshrun: error: run_b: "), mixed.stderr
    # Failures: one line naming the host and the fix, nothing rerun.
    closed = f"{login_node.user}@127.0.0.1:{free_port()}"
    for target, says in ((f"{closed}:{first}", "cannot reach 127.0.0.1 port "),
                         (f"{login_node.login}:{runs}/nosuch", f"127.0.0.1: {runs}/nosuch holds no meshrun run record")):  # fmt: skip
        failed = laptop_python("-m", "launcher.cli", "rerun", target)
        line = failed.stderr.strip().splitlines()
        assert failed.returncode == 3 and len(line) == 1 and says in line[0], failed.stderr
        assert line[0].endswith("(nothing was rerun)"), line
    # The rerun's job is followed from the laptop, then cancelled there.
    shown = laptop_python("-m", "launcher.cli", "status", f"{login_node.login}:{new}")
    assert shown.returncode == 0 and job in shown.stdout, shown.stdout + shown.stderr
    cancelled = laptop_python("-m", "launcher.cli", "cancel", f"{login_node.login}:{new}")
    assert cancelled.returncode == 0 and f"(job {job})" in cancelled.stdout, (
        cancelled.stdout + cancelled.stderr
    )
