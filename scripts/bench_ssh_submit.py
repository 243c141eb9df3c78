"""Submission latency from a laptop over SSH beside the login node's, on the
Slurm test cluster: the whole command (``python -m launcher ...``, start-up
included) run (a) on the login node (this machine, with Slurm) and (b) from a
"laptop" process with no Slurm command on its PATH and no SLURM_CONF,
through a real sshd on 127.0.0.1 (tests/ssh_server.py) with cluster.login:
its first submission ships the code, the later ones find it there (nothing
sent) and share one multiplexed ssh connection. Every job is submitted held
(``launcher.hold=true``) and cancelled at the end.

    eval "$(scripts/testcluster.sh env)"; python scripts/bench_ssh_submit.py [--repeats 3]
    eval "$(scripts/testcluster.sh env)"; python scripts/bench_ssh_submit.py --quick   # seconds (CI)

Then a project (a copy of this repository's launcher/ tree as a script
job's job.workdir) shipped whole and again with one file changed, timed and
counted (only the changed file is sent; the rest is copied on the login node
from the last entry shipped).

Last line: ``bench_ssh_submit: login_node_s=A ssh_s=B ssh_first_s=C ssh_over_login=R
whole_kb=W changed_kb=K changed_files=F changed_over_whole_s=Q`` (A and B the
best of the repeats, C the first over SSH, shipping the code; R = B / A; W
and K the bytes sent for the project whole and with one file changed, F the
files sent then, Q the ratio of their seconds). ``--quick``: one repeat.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the test harness's sshd (tests/ssh_server.py)
BASE = [
    "cluster=testcluster",
    "model=tiny",
    "cluster.nodes=1",
    "cluster.gpus_per_node=1",
    "launcher.exclusive=false",
    "train.steps=1",
    "launcher.hold=true",
    "launcher.job_name=bench-ssh-submit",
]


def submit(env: dict[str, str], overrides: list[str], cwd: Path) -> tuple[float, str, str]:
    """(seconds, job id, the 'submitted over SSH' line or "") of one submission."""
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "launcher", *BASE, *overrides],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=300,
    )  # fmt: skip
    took = time.perf_counter() - t0
    m = re.search(r"^meshrun: submitted job (\d+)", p.stdout, re.MULTILINE)
    if p.returncode or not m:
        sys.exit(
            f"bench_ssh_submit: submission failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}"
        )
    sent = next((ln for ln in p.stdout.splitlines() if ln.startswith("meshrun: submitted over SSH")), "")
    return took, m[1], sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one repeat (CI)")
    args = ap.parse_args()
    repeats = 1 if args.quick else max(1, args.repeats)
    if not os.environ.get("SLURM_CONF"):
        sys.exit('bench_ssh_submit: no test cluster: eval "$(scripts/testcluster.sh env)" first')
    from ssh_server import missing, ssh_server

    if missing():
        sys.exit(f"bench_ssh_submit: {missing()}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-ssh-", dir="/tmp"))
    short = Path(tempfile.mkdtemp(prefix="msb", dir="/tmp"))  # ssh's socket path must be short
    (short / "bin").mkdir()
    for tool in ("sh", "env", "git"):
        found = shutil.which(tool)
        if found:
            os.symlink(found, short / "bin" / tool)
    runs, jobs = tmp / "runs", []
    try:
        with ssh_server(tmp / "sshd", {"SLURM_CONF": os.environ["SLURM_CONF"]}) as server:
            here = {**os.environ, "PYTHONPATH": str(ROOT)}
            laptop = {
                **{k: v for k, v in os.environ.items() if not k.startswith("SLURM")},
                "PATH": f"{server.bindir}:{short / 'bin'}",
                "XDG_RUNTIME_DIR": str(short),
                "XDG_CACHE_HOME": str(short / "cache"),
                "PYTHONPATH": str(ROOT),
            }
            login = [
                f"cluster.login={server.login}",
                f"cluster.python={sys.executable}",
                f"launcher.runs_root={runs}",
            ]
            ssh_s: list[float] = []
            for i in range(repeats + 1):  # the first ships the code
                took, job, sent = submit(laptop, [*login, f"launcher.run_dir={runs}/ssh{i}"], tmp)
                jobs.append(job)
                print(f"over SSH #{i + 1}: {took:.2f} s  {sent.rpartition('(')[2].rstrip(')')}", flush=True)
                ssh_s.append(took)
            here_s: list[float] = []
            for i in range(repeats):
                took, job, _ = submit(
                    here, [f"launcher.runs_root={runs}", f"launcher.run_dir={runs}/here{i}"], tmp
                )
                jobs.append(job)
                print(f"login node #{i + 1}: {took:.2f} s", flush=True)
                here_s.append(took)
            os.environ["XDG_RUNTIME_DIR"] = str(short)  # this process ships too: its socket folder
            os.environ["PATH"] = f"{server.bindir}:{os.environ['PATH']}"
            sys.path.insert(0, str(ROOT))
            delta = ship_changed(server.login, tmp)
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], check=False, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(short, ignore_errors=True)
    a, b = min(here_s), min(ssh_s[1:])
    print(
        f"bench_ssh_submit: login_node_s={a:.2f} ssh_s={b:.2f} ssh_first_s={ssh_s[0]:.2f} "
        f"ssh_over_login={b / a:.2f} {delta}"
    )


def ship_changed(server_login: str, tmp: Path) -> str:
    """A project shipped whole, then with one file changed: the figures' words."""
    from launcher.config.compose import compose
    from launcher.config.validate import parse_login
    from launcher.run import codesnap
    from launcher.run.codeship import Shipped, ship_entry

    project = tmp / "project"
    shutil.copytree(ROOT / "launcher", project / "launcher", ignore=shutil.ignore_patterns("__pycache__"))
    login = parse_login(server_login)
    store = f"{tmp}/runs/.code"

    def ship() -> tuple[float, Shipped]:
        codesnap.forget_listings()
        cfg = compose([f"launcher.runs_root={tmp / 'laptop-runs'}"])
        cfg.job.kind, cfg.job.workdir = "script", str(project)
        _, tree = codesnap.plan_code(cfg)
        assert tree is not None
        entry, _ = codesnap.store_tree(tree, codesnap.store_root(cfg), "project")
        t0 = time.perf_counter()
        shipped = ship_entry(login, Path(entry).parent, store)
        return time.perf_counter() - t0, shipped

    whole_s, whole = ship()
    with open(project / "launcher" / "api.py", "a") as f:
        f.write("# changed\n")
    changed_s, changed = ship()
    print(f"project whole: {whole_s:.2f} s {whole.files} files {whole.bytes_sent / 1e3:.0f} kB; "
          f"one file changed: {changed_s:.2f} s {changed.files} files {changed.bytes_sent / 1e3:.0f} kB")  # fmt: skip
    return (
        f"whole_kb={whole.bytes_sent / 1e3:.0f} changed_kb={changed.bytes_sent / 1e3:.0f} "
        f"changed_files={changed.files} changed_over_whole_s={changed_s / whole_s:.2f}"
    )


if __name__ == "__main__":
    main()
