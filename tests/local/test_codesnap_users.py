"""Code snapshots between two real Unix users (issue 52, findings 1 and 2;
launcher/run/codestore.py): another user cannot read an entry, a 0600 file
stays owner-only, an entry planted under another user's name never runs,
and a group-shared runs root lets teammates read but not write.

Runs as root (CI does): the users and the group are made here and removed."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.config.compose import compose
from launcher.run import codesnap

ROOT = Path(__file__).resolve().parents[2]
USERS = ("msnapa", "msnapb")
GROUP = "msnapg"


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0:
        pytest.fail("these tests make Unix users: run them as root (CI does)")
    subprocess.run(["groupadd", "-f", GROUP], check=True)
    for u in USERS:
        subprocess.run(["userdel", u], capture_output=True)
        subprocess.run(["useradd", "-M", "-N", "-g", GROUP, "-s", "/bin/sh", u], check=True)
    try:
        yield USERS
    finally:
        for u in USERS:
            subprocess.run(["userdel", u], capture_output=True)
        subprocess.run(["groupdel", GROUP], capture_output=True)


@pytest.fixture
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="codesnap-users-", dir="/tmp"))
    os.chmod(d, 0o755)  # pytest's tmp_path is root-only: the users must reach their files
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_user(user: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    env = ["env", "-i", "PATH=/usr/bin:/bin", "HOME=/nonexistent"]
    return subprocess.run(
        ["runuser", "-u", user, "--", *env, *cmd], capture_output=True, text=True, timeout=300
    )


def snapshot_as(user: str, project: Path, runs: Path) -> dict[str, Any]:
    """``user`` packs ``project`` into the store under ``runs`` (what a
    submission does), in a forked child that drops to the user: this
    interpreter lives under /root, which another user cannot run, so the
    modules are loaded here first and the child only switches its ids."""
    warm = compose([f"launcher.runs_root={runs}"])
    warm.job.kind, warm.job.workdir = "script", str(project)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read)
        try:
            pw = pwd.getpwnam(user)
            os.setgroups([pw.pw_gid])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            os.umask(0o022)
            codesnap._TREES.clear()
            codesnap._CACHES.clear()
            _, tree = codesnap.plan_code(warm)
            assert tree is not None
            path, copied = codesnap.store_tree(tree, codesnap.store_root(warm), "project")
            out: dict[str, Any] = {"ok": True, "path": path, "copied": copied}
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return dict(json.loads(data))


def make_project(base: Path, owner: str) -> Path:
    proj = base / f"proj-{owner}"
    (proj / "pkg").mkdir(parents=True)
    (proj / "train.py").write_text("print('train')\n")
    (proj / "pyproject.toml").write_text("")
    (proj / "pkg" / "private_notes.py").write_text("NOTES = 1\n")
    os.chmod(proj / "pkg" / "private_notes.py", 0o600)
    subprocess.run(["chown", "-R", owner, str(proj)], check=True)
    return proj


def test_another_user_cannot_read_an_entry_and_0600_stays_owner_only(
    users: tuple[str, str], base: Path
) -> None:
    a, b = users
    proj = make_project(base, a)
    (base / "runs-a").mkdir()
    subprocess.run(["chown", a, str(base / "runs-a")], check=True)  # a's own runs root
    p = snapshot_as(a, proj, base / "runs-a")
    assert p["ok"], p
    path = p["path"]
    assert p["copied"] and f"/.code/{a}/" in path
    st = os.stat(Path(path) / "pkg" / "private_notes.py")
    assert st.st_mode & 0o777 == 0o400 and st.st_uid != 0
    assert os.stat(Path(path).parents[1]).st_mode & 0o777 == 0o700
    for target in (Path(path) / "train.py", Path(path).parents[1]):
        denied = as_user(b, "cat" if target.suffix else "ls", str(target))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied


def test_an_entry_planted_under_another_users_name_never_runs(users: tuple[str, str], base: Path) -> None:
    a, b = users
    proj = make_project(base, a)
    os.chmod(proj / "pkg" / "private_notes.py", 0o644)  # b must be able to hash a's code to plant it
    runs = base / "scratch"
    runs.mkdir()
    os.chmod(runs, 0o1777)  # a world-writable scratch runs root
    planted = snapshot_as(b, proj, runs)  # b's own entry of a's code, then copied under a's name, edited
    assert planted["ok"], planted
    b_entry = Path(planted["path"]).parent
    steps = (
        f"chmod 777 {runs}/.code && cp -r {b_entry.parent} {runs}/.code/{a} && "
        f"chmod -R u+w {runs}/.code/{a} && echo 'import os; os.system(\"evil\")' > {runs}/.code/{a}/{b_entry.name}/project/train.py"
    )
    assert as_user(b, "sh", "-c", steps).returncode == 0
    p = snapshot_as(a, proj, runs)
    assert not p["ok"]
    assert f"the code store {runs}/.code/{a} is owned by {b} or writable by others" in p["error"], p


def test_a_group_shared_runs_root_lets_teammates_read_never_write(users: tuple[str, str], base: Path) -> None:
    a, b = users
    runs = base / "team"
    runs.mkdir()
    subprocess.run(["chgrp", GROUP, str(runs)], check=True)
    os.chmod(runs, 0o2770)
    proj = make_project(base, a)
    p = snapshot_as(a, proj, runs)
    assert p["ok"], p
    path = Path(p["path"])
    assert os.stat(runs / ".code").st_mode & 0o7777 == 0o3770
    assert os.stat(path.parents[1]).st_mode & 0o7777 == 0o2750
    assert as_user(b, "cat", str(path / "train.py")).returncode == 0  # teammates read (meshrun diff)
    assert as_user(b, "cat", str(path / "pkg" / "private_notes.py")).returncode != 0  # 0600 stays owner-only
    for attempt in (
        f"echo x > {path.parents[1]}/.hashcache.json",
        f"mv {path.parents[1]} {runs}/.code/stolen",
        f"mkdir {path.parent}/x",
    ):
        assert as_user(b, "sh", "-c", attempt).returncode != 0, attempt
    mine = snapshot_as(b, make_project(base, b), runs)  # b's own store beside a's
    assert mine["ok"] and f"/.code/{b}/" in mine["path"], mine
