"""``meshrun fleet`` and ``meshrun init`` from a laptop over SSH, against the
real test cluster: a real sshd on 127.0.0.1 (tests/ssh_server.py) whose
sessions see the test cluster (SLURM_CONF) is the login node; the laptop is
a process with no Slurm command on its PATH and no SLURM_CONF. The fleet
table of a runs root there shows a job from the login node's sacct; its page,
served here, answers the same view and a run's charts from its metrics there.
``meshrun init --login`` writes a preset from the login node's Slurm that a
dry run from the laptop then uses over SSH."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from harness import REPO, cluster_base
from ssh_server import SshServer

from launcher.config.validate import parse_login
from launcher.slurm import cluster, remote

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]


@pytest.fixture
def laptop(login_node: SshServer, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The laptop's environment: the server's ssh wrapper and a few tools on
    PATH (no Slurm command), no SLURM_CONF, a private socket folder, its own
    config dir."""
    short = Path(tempfile.mkdtemp(prefix="msh", dir="/tmp"))
    (short / "bin").mkdir()
    for tool in ("sh", "env", "git"):
        os.symlink(shutil.which(tool) or f"/bin/{tool}", short / "bin" / tool)
    yield {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLURM")},
        "PATH": f"{login_node.bindir}:{short / 'bin'}",
        "SLURM_CONF": "",
        "XDG_RUNTIME_DIR": str(short),
        "XDG_CACHE_HOME": str(short / "cache"),  # the laptop's own code store
        "MESHRUN_CONFIG_DIR": str(tmp_path / "conf"),
        "PYTHONPATH": str(REPO),
    }
    login = parse_login(login_node.login)
    remote.close_connection(login, control=short / f"meshrun-ssh-{os.getuid()}")
    shutil.rmtree(short, ignore_errors=True)


def meshrun(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args],
        capture_output=True, text=True, timeout=120, env=env, cwd=cwd,
    )  # fmt: skip


def test_the_fleet_of_a_runs_root_on_the_login_node_shown_and_served_on_a_laptop(
    login_node: SshServer, laptop: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("PATH", "XDG_RUNTIME_DIR", "SLURM_CONF"):  # this process is the laptop too
        monkeypatch.setenv(key, laptop[key])
    # A held job on the login node's Slurm, and a run dir naming it under the runs root there.
    out = cluster.run(
        ["sbatch", "--parsable", "--hold", "-p", "research", "-A", "research", "-q", "research", "-t", "5",
         "-J", "meshrun-fleet-ssh", "-o", "/dev/null", "--wrap", "true"],
        login=login_node.login,
    )  # fmt: skip
    job = out.stdout.strip().split(";")[0]
    assert job.isdigit(), out
    try:
        root = tmp_path / "cluster-runs"
        run = root / "r1"
        (run / "slurm").mkdir(parents=True)
        (run / "spec.json").write_text(
            json.dumps({"cfg": {"cluster": {"name": "testcluster", "kind": "slurm"}}})
        )
        (run / "slurm" / "job.json").write_text(json.dumps({"job_id": job}))
        steps = [{"step": s, "loss": 5.0 - s, "tokens_per_s": 100.0 * s} for s in (1, 2, 3)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
        target = f"{login_node.login}:{root}"
        # sacct (slurmdbd) may list a job only a moment after sbatch: asked again until it does.
        deadline = time.monotonic() + 60
        while True:
            shown = meshrun(
                "fleet", target, "--json", "--no-write", "--python", sys.executable, env=laptop, cwd=tmp_path
            )
            assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr[-2000:]
            view = json.loads(shown.stdout)
            if view["runs"][0]["state"] != "UNKNOWN" or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert view["root"] == str(root) and view["scheduler_error"] is None, view
        [row] = view["runs"]
        assert row["job_id"] == job and row["state"] == "PENDING" and row["step"] == 3, row
        assert list((root / ".code").iterdir()), "the laptop's meshrun code shipped there"
        # The page, served here: its JSON and a run's charts from the metrics there.
        page = subprocess.Popen(
            [sys.executable, "-m", "launcher.cli", "fleet", target, "--serve", "--port", "0",
             "--python", sys.executable],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=laptop, cwd=tmp_path,
        )  # fmt: skip
        try:
            first = page.stdout.readline() if page.stdout else ""
            m = re.search(r"(http://127\.0\.0\.1:\d+/)\?token=(\S+)", first)
            assert m and f"serving {target} on" in first, first + (page.stderr.read() if page.poll() else "")
            opener = urllib.request.build_opener()
            opener.addheaders = [("Cookie", f"meshrun_fleet_token={m[2]}")]
            served = json.loads(opener.open(m[1] + "api/fleet.json", timeout=60).read())
            assert [(r["job_id"], r["state"]) for r in served["runs"]] == [(job, "PENDING")], served
            index = opener.open(m[1], timeout=60).read().decode()
            rid = re.search(r"/run/([0-9a-f]{12})", index)
            assert rid, index[:2000]
            svg = opener.open(f"{m[1]}run/{rid[1]}.svg", timeout=60).read().decode()
            assert "no step logged yet" not in svg and "<svg" in svg
        finally:
            page.terminate()
            page.wait(timeout=30)
        assert not list(root.rglob("goodput.json")), "--no-write and --serve write nothing there"
        # The table: the same run, the login node's state; goodput.json written there, as when typed there.
        table = meshrun("fleet", target, "--python", sys.executable, env=laptop, cwd=tmp_path)
        assert table.returncode == 0 and job in table.stdout and "PENDING" in table.stdout, table.stdout
        assert (run / "goodput.json").is_file()
    finally:
        cluster.run(["scancel", job], login=login_node.login, check=False)


def test_init_from_a_laptop_writes_a_preset_from_the_login_nodes_slurm_that_submits_over_ssh(
    login_node: SshServer, laptop: dict[str, str], tmp_path: Path
) -> None:
    conf = Path(laptop["MESHRUN_CONFIG_DIR"])
    # A Python there without meshrun's packages, a port nobody listens on: one line each, no preset.
    for bad, said in (
        (["--login", login_node.login, "--python", "/nonexistent/python"], "/nonexistent/python: not found"),
        (["--login", f"{login_node.user}@127.0.0.1:1"], "cannot reach 127.0.0.1 port 1 over SSH"),
    ):
        out = meshrun("init", "--name", "sshinit", *bad, env=laptop, cwd=tmp_path)
        assert out.returncode == 3 and said in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
        assert "--python" in out.stderr or "ssh -p 1" in out.stderr, out.stderr  # the fix
        assert not conf.exists(), "no preset written"
    out = meshrun(
        "init", "--name", "sshinit", "--login", login_node.login, "--python", sys.executable,
        "gpu_mem_gb=80", "device=cpu", "fabric=tcp", env=laptop, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "partition    research" in out.stdout, out.stdout  # the login node's Slurm answered
    preset = yaml.safe_load((conf / "cluster" / "sshinit.yaml").read_text())
    assert preset["login"] == login_node.login and preset["python"] == sys.executable, preset
    assert preset["kind"] == "slurm" and preset["node_gpus"] == 8 and preset["cluster_nodes"] == 4, preset
    # From the laptop, the preset alone makes a dry run ask the login node's Slurm.
    dry = subprocess.run(
        [sys.executable, "-m", "launcher", "cluster=sshinit", *cluster_base()[1:], "qos=research",
         f"launcher.run_dir={tmp_path / 'run'}", "launcher.dry_run=true"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=laptop,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    said = [ln for ln in dry.stdout.splitlines() if ln.startswith("meshrun: sbatch --test-only: ")]
    assert len(said) == 1 and "to start" in said[0], dry.stdout[-3000:]
