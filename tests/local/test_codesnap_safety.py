"""The code snapshot is safe and faithful (issue 52; launcher/run/codesnap.py,
codewalk.py, codestore.py, codegc.py): one test per finding, each failing on
the code before the fix. The two-user findings are tests/local/test_codesnap_users.py."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.schema import RunConfig
from launcher.config.validate import ConfigError
from launcher.run import codegc, codesnap, codestore

ROOT = Path(__file__).resolve().parents[2]
GIT = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "protocol.file.allow=always"]
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU=\n-----END OPENSSH PRIVATE KEY-----\n"


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *GIT, *args], check=True, capture_output=True)


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


@pytest.fixture(autouse=True)
def _fresh() -> None:
    codesnap._TREES.clear()
    codesnap._CACHES.clear()


def script_cfg(project: Path, runs: Path, *overrides: str) -> RunConfig:
    cfg = compose([f"launcher.runs_root={runs}", *overrides])
    cfg.job.kind, cfg.job.workdir = (
        "script",
        str(project),
    )  # what job=script with job.script=<project>/train.py sets
    return cfg


def store_project(cfg: RunConfig) -> tuple[codesnap.Tree, Path]:
    _, project = codesnap.plan_code(cfg)
    assert project is not None
    path, _ = codesnap.store_tree(project, codesnap.store_root(cfg), "project")
    return project, Path(path)


def packed(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if not p.is_dir())


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    write(root / "train.py", "print('train')\n")
    write(root / "pyproject.toml", "[project]\nname='p'\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "one")
    return root


def test_1_credentials_are_left_out_named_and_modes_never_widen(project: Path, tmp_path: Path) -> None:
    write(project / ".env", "AWS_SECRET_ACCESS_KEY=abc\n", 0o600)
    write(project / "s3" / "credentials", "[default]\naws_secret_access_key=abc\n", 0o600)
    write(project / "deploy" / "bot", KEY, 0o600)  # a private key by content, whatever its name
    write(project / "notes.py", "N = 1\n", 0o600)  # not a credential: packed, and stays owner-only
    cfg = script_cfg(project, tmp_path / "runs")
    snap = codesnap.plan_snapshot(cfg)
    line = codesnap.describe(snap, planned=True)
    for name in (
        ".env (named like a credential",
        "s3/credentials (named like",
        "deploy/bot (holds a private key)",
    ):
        assert name in line, line
    tree, path = store_project(cfg)
    assert packed(path) == ["notes.py", "pyproject.toml", "train.py"]
    assert stat.S_IMODE(os.stat(path / "notes.py").st_mode) == 0o400
    assert stat.S_IMODE(os.stat(path / "train.py").st_mode) == 0o444
    entry = path.parent
    for d in (entry, entry.parent, path):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    meta = json.loads((entry / codesnap.SNAPSHOT_FILE).read_text())
    assert not any(".env" in f or "credentials" in f for f in meta["files"])
    # Packed on purpose: named in launcher.code_include, its mode kept less write bits.
    codesnap._TREES.clear()
    _, path = store_project(script_cfg(project, tmp_path / "runs", "launcher.code_include=[.env]"))
    assert stat.S_IMODE(os.stat(path / ".env").st_mode) == 0o400
    with pytest.raises(ConfigError, match=r"launcher.code_include\[0\]='nope.env' is invalid: no such file"):
        codesnap.plan_code(script_cfg(project, tmp_path / "runs", "launcher.code_include=[nope.env]"))


def test_1_a_home_directory_or_root_workdir_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    write(home / "train.py", "print(1)\n")
    write(home / ".ssh" / "id_ed25519", KEY, 0o600)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(ConfigError, match=r"job.workdir='.*/home' is invalid: is / or a home directory"):
        codesnap.plan_code(script_cfg(home, tmp_path / "runs"))
    with pytest.raises(ConfigError, match=r"job.workdir='/' is invalid"):
        codesnap.plan_code(script_cfg(Path("/"), tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


def test_1_the_recorded_diff_is_scanned(project: Path, tmp_path: Path) -> None:
    write(project / ".env", "A=1\n")
    git(project, "add", "-f", ".env")
    git(project, "commit", "-q", "-m", "env")
    write(project / ".env", "A=ghp_" + "x" * 36 + "\n")
    write(project / "train.py", "TOKEN = 'hf_" + "a" * 34 + "'\n")
    tree = codesnap.list_tree(str(project), tops=(".",), files=())
    diff = tree.git["diff"]
    assert "hf_aaaa" not in diff and "ghp_" not in diff and "TOKEN = '***'" in diff
    assert tree.git["diff_redacted"] == [
        ".env: left out (a credentials file)",
        "train.py: a credential masked",
    ]
    snap = codesnap.plan_snapshot(script_cfg(project, tmp_path / "runs"))
    assert "hf_aaaa" not in json.dumps(snap.record())


def test_2_a_tampered_or_planted_entry_is_rebuilt_never_run(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = script_cfg(project, tmp_path / "runs")
    tree, path = store_project(cfg)
    os.chmod(path / "train.py", 0o644)
    (path / "train.py").write_text("import os; os.system('evil')\n")
    os.chmod(path / "train.py", 0o444)
    codesnap._CACHES.clear()
    again, copied = codesnap.store_tree(tree, codesnap.store_root(cfg), "project")
    assert copied and Path(again).joinpath("train.py").read_text() == "print('train')\n"
    assert "failed verification (train.py differs from its manifest): rebuilt" in capsys.readouterr().err
    # An extra file planted beside the manifest's, and an entry with no lock file: rebuilt too.
    os.chmod(path, 0o700)
    write(path / "sitecustomize.py", "evil\n", 0o444)
    assert codesnap.store_tree(tree, codesnap.store_root(cfg), "project")[1]
    assert not (path / "sitecustomize.py").exists()
    os.chmod(path.parent, 0o700)
    (path.parent / codestore.LOCK_FILE).unlink()
    codestore.release(path.parent)
    assert codesnap.store_tree(tree, codesnap.store_root(cfg), "project")[1]


def test_2_the_hash_cache_is_per_user_and_re_read_when_a_file_changes(project: Path, tmp_path: Path) -> None:
    cfg = script_cfg(project, tmp_path / "runs")
    tree, _ = store_project(cfg)
    codesnap._cache(codesnap.store_root(cfg)).save()
    cache_file = codestore.user_store(codesnap.store_root(cfg)) / codestore.HASH_CACHE
    assert cache_file.is_file() and stat.S_IMODE(cache_file.stat().st_mode) == 0o600
    assert not (codesnap.store_root(cfg) / codestore.HASH_CACHE).exists()  # no shared cache
    # A forged entry that keeps size and mtime but not ctime: the file is read again.
    src = str(project / "train.py")
    st = os.stat(src)
    (project / "train.py").write_text("print('TRAIN')\n")
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    cache = codestore.HashCache(cache_file)
    assert cache.digest(src) != tree.hashes["train.py"]


def wrapper(run: Path, packed: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``python -m launcher.taskwrap RUN`` as rank 0 of a Slurm task running the packed project."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0", "WORLD_SIZE": "1", "MESHRUN_ATTEMPT": "0.0"}
    env.update(MESHRUN_PROJECT_DIR=str(packed), MESHRUN_NODE_HEARTBEAT_DIR=str(tmp_path / "local"))
    env.pop("MESHRUN_LAUNCHER_PID", None)
    cmd = [sys.executable, "-m", "launcher.taskwrap", str(run)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_3_6_a_resubmitted_run_runs_the_fixed_code_in_its_own_writable_copy(
    project: Path, tmp_path: Path
) -> None:
    """v1 raises; the fix is committed and the same run dir resubmitted:
    the job ran v1 again (its workdir was the first entry's, never compared).
    The program also appends to a project file: through a hard link a root
    program wrote into the shared store entry every later run reuses."""
    from harness import spec_of

    write(project / "notes.txt", "notes\n")
    write(project / "train.py", "open('notes.txt', 'a').write('run\\n')\nraise ValueError('bug in v1')\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "v1")
    cfg = script_cfg(project, tmp_path / "runs")
    _, v1 = store_project(cfg)
    run = Path(spec_of(tmp_path, f"job.workdir={project}", script=str(project / "train.py")).run_dir)
    first = wrapper(run, v1, tmp_path)
    assert first.returncode == 1 and "bug in v1" in first.stderr, first.stderr[-2000:]
    work = run / "workdir"
    assert (work / "notes.txt").read_text() == "notes\nrun\n" and (v1 / "notes.txt").read_text() == "notes\n"
    assert os.stat(work / "train.py").st_ino != os.stat(v1 / "train.py").st_ino
    write(project / "train.py", "print('fixed', open('notes.txt').read().count('run'))\n")
    git(project, "commit", "-qam", "the fix")
    codesnap._TREES.clear()
    _, v2 = store_project(cfg)
    assert v2 != v1
    again = wrapper(run, v2, tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "fixed 1" in again.stdout  # the new code, and the run's own edit of its notes kept
    assert "this run's code changed since its workdir was made" in again.stderr
    assert "1 file(s) updated, 0 added, 0 removed" in again.stderr


def test_4_submodules_nested_repos_and_linked_folders_are_packed(project: Path, tmp_path: Path) -> None:
    sub = tmp_path / "sub"
    write(sub / "lib.py", "L = 1\n")
    git(sub, "init", "-q")
    git(sub, "add", "-A")
    git(sub, "commit", "-q", "-m", "s")
    git(project, "submodule", "add", "-q", str(sub), "third_party/sub")
    write(project / "nested" / "n.py", "N = 1\n")
    git(project / "nested", "init", "-q")
    shared = write(tmp_path / "shared" / "configs" / "a.yaml", "lr: 1\n").parent
    os.symlink(shared, project / "configs")
    os.symlink(".", project / "configs_loop")  # a cycle: named, not followed forever
    cfg = script_cfg(project, tmp_path / "runs")
    tree, path = store_project(cfg)
    assert packed(path) == [
        ".gitmodules",
        "configs/a.yaml",
        "nested/n.py",
        "pyproject.toml",
        "third_party/sub/lib.py",
        "train.py",
    ]
    assert ("configs_loop", "a symlink cycle") in tree.left_out
    before = tree.digest
    write(shared / "a.yaml", "lr: 2\n")
    codesnap._TREES.clear()
    assert codesnap.plan_code(cfg)[1].digest != before  # type: ignore[union-attr]
    write(project / "third_party" / "sub" / "lib.py", "L = 2\n")
    codesnap._TREES.clear()
    assert codesnap.plan_code(cfg)[1].digest not in {before}  # type: ignore[union-attr]


def _holder(cfg_runs: Path, project: Path, *, sleep: float) -> subprocess.Popen[str]:
    """Another submission (its own process) using the same entry."""
    code = (
        "import sys, time; from launcher.config.compose import compose; from launcher.run import codesnap\n"
        f"cfg = compose(['launcher.runs_root={cfg_runs}']); cfg.job.kind, cfg.job.workdir = 'script', '{project}'\n"
        "_, p = codesnap.plan_code(cfg); print(codesnap.store_tree(p, codesnap.store_root(cfg), 'project'), flush=True)\n"
        f"time.sleep({sleep})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and "False)" in proc.stdout.readline()  # reused, not made
    return proc


def test_5_a_refused_submission_leaves_entries_others_use(project: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    cfg = script_cfg(project, runs)
    undo = codesnap.StoreUndo(cfg)
    _, path = store_project(cfg)
    snap = codesnap.CodeSnapshot(digest="", meshrun_dir="", created=[str(path.parent)])
    live = _holder(runs, project, sleep=60)  # still submitting
    try:
        undo.undo(snap)
        assert path.is_dir()
    finally:
        live.kill()
        live.wait()
    undo.undo(snap)  # that one has finished: its queued job names the entry (use mark)
    assert path.is_dir()
    # Made and used by nobody else: taken back, with the store folders it made.
    (codestore.user_store(codesnap.store_root(cfg)) / codestore.USED_DIR / path.parent.name).unlink()
    undo.undo(snap)
    assert not path.parent.exists() and not runs.exists()


def test_5_gc_removes_only_entries_no_live_run_uses(project: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    cfg = script_cfg(project, runs)
    _, used = store_project(cfg)
    write(project / "train.py", "print('v2')\n")
    codesnap._TREES.clear()
    _, old = store_project(cfg)
    for p in (used.parent, old.parent):
        os.utime(p, (time.time() - 30 * 86400,) * 2)
    run = runs / "r1"
    write(
        run / "run_record.json",
        json.dumps({"submitted_at": time.time(), "code": {"project": {"dir": str(used)}}}),
    )
    codestore.release(old.parent)  # that submission has ended
    removed, kept = codegc.gc(runs, keep_days=7)
    assert removed == [str(old.parent)] and kept == [f"{used.parent} (used by {run})"]


@pytest.mark.parametrize("in_git", [False, True])
def test_7_the_runs_root_and_any_store_are_never_packed(tmp_path: Path, in_git: bool) -> None:
    proj = tmp_path / "plain"  # no git: every file is walked; in git: runs/ untracked, not ignored
    write(proj / "train.py", "x\n")
    write(proj / "pyproject.toml", "")
    if in_git:
        git(proj, "init", "-q")
    write(proj / "runs" / "old" / "run_record.json", "{}")
    write(proj / "elsewhere" / ".code" / "u" / "d" / "snapshot.json", "{}")
    cfg = script_cfg(proj, proj / "runs")
    _, tree = codesnap.plan_code(cfg)
    assert tree is not None and [f for f, _ in tree.files] == ["pyproject.toml", "train.py"]
    _, path = store_project(cfg)
    codesnap._TREES.clear()
    _, again = codesnap.plan_code(cfg)  # the store now under the project: still the same tree
    assert (
        again is not None and again.digest == tree.digest and packed(path) == ["pyproject.toml", "train.py"]
    )


def test_8_a_fifo_or_socket_does_not_block_and_is_named(tmp_path: Path) -> None:
    proj = tmp_path / "plain"
    write(proj / "train.py", "x\n")
    write(proj / "pyproject.toml", "")
    os.mkfifo(proj / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(proj / "s.sock"))
    code = (
        "from launcher.config.compose import compose; from launcher.run import codesnap\n"
        f"cfg = compose(['launcher.runs_root={tmp_path / 'runs'}']); cfg.job.kind, cfg.job.workdir = 'script', '{proj}'\n"
        "print(codesnap.describe(codesnap.plan_snapshot(cfg), planned=True))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    sock.close()
    assert p.returncode == 0, p.stderr
    assert (
        "pipe (a special file (a FIFO), skipped)" in p.stdout
        and "s.sock (a special file (a socket)" in p.stdout
    )


@pytest.mark.parametrize("in_git", [True, False])
def test_list_prints_exactly_what_is_packed(project: Path, tmp_path: Path, in_git: bool) -> None:
    if not in_git:
        subprocess.run(["rm", "-rf", str(project / ".git")], check=True)
    write(project / ".env", "A=1\n", 0o600)
    write(project / "pkg" / "m.py", "M = 1\n")
    os.mkfifo(project / "pipe")
    runs = project / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["--list", "--workdir", str(project), "--runs-root", str(runs)]
    p = subprocess.run(
        [sys.executable, "-m", "launcher.snapshot", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    listed = [ln.split()[-1] for ln in p.stdout.splitlines() if ln.strip()[:1].isdigit()]
    _, path = store_project(script_cfg(project, runs))
    assert listed == packed(path) and "left out  .env (named like a credential" in p.stdout
    # git never lists a FIFO; outside git the walk names it.
    assert ("left out  pipe (a special file (a FIFO), skipped)" in p.stdout) is not in_git


def test_a_project_kept_under_the_runs_root_is_packed_whole(tmp_path: Path) -> None:
    """The runs root is left out of a project that holds it, never the reverse:
    runs_root=/scratch/me with the project at /scratch/me/proj packs the project."""
    from launcher.config.compose import compose
    from launcher.run.codesnap import plan_snapshot

    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "data" / "rows.jsonl").write_text("{}\n")
    (proj / "train.py").write_text("print(1)\n")
    cfg = compose(
        ["job=script", f"job.script={proj / 'train.py'}", f"job.workdir={proj}", f"launcher.runs_root={tmp_path}",
         "cluster=testcluster"]
    )  # fmt: skip
    snap = plan_snapshot(cfg)
    assert snap.project is not None and snap.project["files"] == 2, snap.project


def test_2_the_data_cache_is_per_user_and_a_planted_one_is_not_trusted(tmp_path: Path) -> None:
    """The data manifest's digests were cached in one shared
    ``.code/.datacache.json`` that anyone who can write the runs root could
    edit, steering the digest a run record names for a data file. Now the
    cache is the user's own (0600, in the private store folder) and read
    only when it is theirs and writable by nobody else."""
    from harness import spec_of

    from launcher.run import record

    tokens = write(tmp_path / "data" / "tokens.bin", "abc")
    spec = spec_of(tmp_path, f"launcher.runs_root={tmp_path / 'runs'}", f"job.prompts={tokens}")
    got = record.data_manifest(spec)["files"]
    assert [(f["field"], f["size"]) for f in got] == [("job.prompts", 3)]
    real = got[0]["digest"]
    cache = codestore.user_store(codesnap.store_root(spec.cfg)) / codestore.DATA_CACHE
    assert (
        stat.S_IMODE(cache.stat().st_mode) == 0o600
        and not (tmp_path / "runs" / ".code" / ".datacache.json").exists()
    )
    # A teammate's planted entry (the same size, mtime, inode, ctime; another digest).
    st = os.stat(tokens)
    planted = {str(tokens): [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, "xxh3_128:planted"]}
    cache.write_text(json.dumps(planted))
    cache.chmod(0o666)
    assert record.data_manifest(spec)["files"][0]["digest"] == real
    cache.write_text(json.dumps(planted))
    cache.chmod(0o600)
    os.chown(cache, 65534, -1)  # not this user's
    assert record.data_manifest(spec)["files"][0]["digest"] == real


RESUMER = """
import glob, os
found = sorted(glob.glob("ckpt/*.pt"))
start = int(open(found[-1]).read()) if found else 0
print(f"cwd {os.getcwd()} resumed from step {start}", flush=True)
for step in range(start + 1, start + 4):
    print(f"step {step} loss 0.5", flush=True)
if os.environ["RANK"] == "0":  # rank 0 saves, as a trainer does
    os.makedirs("ckpt", exist_ok=True)
    open("ckpt/last.pt", "w").write(str(start + 3))
"""


def test_10_a_local_run_starts_in_its_own_workdir_and_never_resumes_another_runs_checkpoint(
    tmp_path: Path,
) -> None:
    """Local runs ran in the live project: a relative checkpoint path left
    ``ckpt/`` there, the next run (a new run dir) resumed from it, and the
    next cluster run packed it. Now a local run's program starts in its run
    dir's own copy of the stored project, as on Slurm."""
    from harness import launch

    proj = tmp_path / "proj"
    write(proj / "pyproject.toml", "[project]\nname='p'\n")
    write(proj / "train.py", RESUMER)
    base = ["job=script", f"job.script={proj / 'train.py'}", f"launcher.runs_root={tmp_path / 'runs'}"]
    for name in ("a", "b"):
        p = launch(*base, run_dir=tmp_path / "runs" / name, cwd=proj, timeout=180)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        log = (tmp_path / "runs" / name / "logs" / "rank0.log").read_text()
        work = tmp_path / "runs" / name / "workdir"
        assert f"cwd {work} resumed from step 0" in log, log  # b never sees a's checkpoint
        assert (work / "ckpt" / "last.pt").read_text() == "3"
    assert not (proj / "ckpt").exists()  # the project never collects a run's outputs
    rec = json.loads((tmp_path / "runs" / "a" / "run_record.json").read_text())
    assert Path(rec["code"]["project"]["dir"]).parent.parent.parent.name == ".code", rec["code"]["project"]
