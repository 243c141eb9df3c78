"""The SSH transport (launcher/slurm/remote.py) against a real OpenSSH
server on 127.0.0.1 (tests/ssh_server.py): a command's output and exit code
round-trip with every word as typed; each failure is one line naming the
host and the fix (no Slurm on the login node, a closed port, a refused key,
an unknown host key, never accepted); one shared connection; and
``meshrun status`` / ``cancel`` of a run made with ``cluster.login`` ask
that login node's Slurm, never this machine's. A run refused for its
``cluster.login`` leaves nothing behind.

The login node's side is the server's session environment: its PATH is a
folder of a few tools and, where a test says so, a stand-in Slurm command
that records its arguments (tests only: meshrun never places commands on
a login node)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import REPO, fake_sbatch_cli
from ssh_server import SshServer, missing, ssh_server

from launcher.config.validate import Login, parse_login
from launcher.slurm import cluster, remote

# What a login node has (coreutils, tar, find), without Slurm.
TOOLS = (
    "sh",
    "bash",
    "env",
    "cat",
    "printf",
    "id",
    "mkdir",
    "rm",
    "mv",
    "chmod",
    "mktemp",
    "tar",
    "find",
    "wc",
    "sha256sum",
)


@pytest.fixture(scope="module")
def login_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SshServer, Path]]:
    """(the server, the login node's PATH folder: a few tools, no Slurm)."""
    why = missing()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("sshd")
    remote_bin = tmp / "login-bin"
    remote_bin.mkdir()
    for tool in TOOLS:
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True)
        if found.returncode == 0 and found.stdout.startswith("/"):
            os.symlink(found.stdout.strip(), remote_bin / tool)
    with ssh_server(tmp / "server", {"PATH": str(remote_bin)}) as server:
        yield server, remote_bin


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path (ssh's socket path holds 108 bytes; tmp_path's is long)."""
    path = Path(tempfile.mkdtemp(prefix="msh", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def laptop(
    login_node: tuple[SshServer, Path], monkeypatch: pytest.MonkeyPatch, short_dir: Path
) -> Iterator[Login]:
    """This process as the laptop: the server's client wrapper first on PATH,
    a private socket folder of its own."""
    server, _ = login_node
    monkeypatch.setenv("PATH", f"{server.bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir))
    login = parse_login(server.login)
    yield login
    remote.close_connection(login)


def test_a_command_round_trips_its_output_and_exit_code(laptop: Login) -> None:
    out = remote.remote_run(laptop, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (out.returncode, out.stdout, out.stderr.splitlines()[-1]) == (3, "out\n", "err")


def test_every_word_reaches_the_login_node_as_typed(laptop: Login, tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    words = ["a b", "$(touch " + str(canary) + ")", f"; touch {canary}", "`id`", "'", '"', "*", "-n"]
    out = remote.remote_run(laptop, ["printf", "%s\\n", *words])
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == words
    assert not canary.exists()


def test_a_login_node_without_slurm_is_said_in_one_line(laptop: Login) -> None:
    with pytest.raises(remote.RemoteError) as info:
        remote.check_login_node(laptop)
    msg = str(info.value)
    assert msg.startswith("no Slurm on the login node 127.0.0.1: `command -v sbatch` finds nothing there")
    assert "\n" not in msg and "PATH" in msg
    with pytest.raises(cluster.SlurmUnavailable) as info2:
        cluster.run(["squeue", "-h"], login=str(laptop))
    assert str(info2.value).startswith("no Slurm on the login node 127.0.0.1: `command -v squeue`")


def test_commands_share_one_multiplexed_connection(laptop: Login) -> None:
    for _ in range(3):
        assert remote.remote_run(laptop, ["sh", "-c", "exit 0"]).returncode == 0
    sockets = os.listdir(remote.control_dir())
    assert len(sockets) == 1, sockets
    assert oct(remote.control_dir().stat().st_mode & 0o777) == "0o700"


def test_a_closed_port_is_one_line_naming_the_host(laptop: Login) -> None:
    from harness import free_port

    closed = Login(laptop.user, "127.0.0.1", free_port())
    with pytest.raises(remote.RemoteError) as info:
        remote.remote_run(closed, ["true"])
    msg = str(info.value)
    assert msg.startswith(f"cannot reach 127.0.0.1 port {closed.port} over SSH (ssh: connect to host")
    assert "Connection refused" in msg and "\n" not in msg


def test_a_refused_key_is_one_line_naming_the_host_and_the_fix(laptop: Login) -> None:
    stranger = Login("nobody", laptop.host, laptop.port)  # not a user the server lets in
    with pytest.raises(remote.RemoteError) as info:
        remote.remote_run(stranger, ["true"])
    msg = str(info.value)
    assert msg.startswith(f"127.0.0.1 port {laptop.port} refused the SSH login of nobody")
    assert "ssh-copy-id" in msg and "never a password" in msg and "\n" not in msg


def test_an_unknown_host_key_is_refused_never_accepted(
    login_node: tuple[SshServer, Path],
    laptop: Login,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    short_dir: Path,
) -> None:
    server, _ = login_node
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    config = tmp_path / "ssh_config"
    config.write_text(server.client_config.read_text().replace(str(server.known_hosts), str(empty)))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {config} "$@"\n')
    (bindir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir / "other"))
    (short_dir / "other").mkdir()
    with pytest.raises(remote.RemoteError) as info:
        remote.remote_run(laptop, ["true"])
    msg = str(info.value)
    assert msg.startswith(f"127.0.0.1 port {laptop.port}: its SSH host key is not in your known_hosts")
    assert "never turns host key checking off" in msg
    assert empty.read_text() == ""  # not learned on the way


# --- meshrun status / cancel of a run made with cluster.login ---------------


def stand_in(remote_bin: Path, name: str, calls: Path, body: str) -> None:
    """A Slurm command on the login node's PATH that records its argv (a line
    a call, the words apart by US, 0x1f)."""
    script = remote_bin / name
    quoted = shlex.quote(str(calls))
    record = f'printf \'%s\\037\' "TF=$SLURM_TIME_FORMAT" {name} "$@" >> {quoted}; echo >> {quoted}'
    script.write_text(f"#!/bin/sh\n{record}\n{body}\n")
    script.chmod(0o755)


def run_dir_with_login(tmp_path: Path, login: str, job_id: str) -> Path:
    """A run dir as a submission over SSH would leave it: its spec names cluster.login, its job is ``job_id``."""
    run = tmp_path / "run"
    (run / "slurm").mkdir(parents=True)
    spec = {"cfg": {"cluster": {"name": "remote", "kind": "slurm", "login": login}}}
    (run / "spec.json").write_text(json.dumps(spec))
    (run / "slurm" / "job.json").write_text(json.dumps({"job_id": job_id}))
    return run


def meshrun(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
    )


@pytest.fixture
def laptop_env(login_node: tuple[SshServer, Path], short_dir: Path) -> Iterator[dict[str, str]]:
    """A meshrun process's environment as the laptop's: on PATH only the
    server's ssh wrapper and the few tools meshrun and ssh need (no Slurm
    command), no SLURM_CONF; its shared connection closed afterwards."""
    server, _ = login_node
    laptop_bin = short_dir / "bin"
    laptop_bin.mkdir()
    for tool in ("python3", "sh", "env"):
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True)
        if found.stdout.startswith("/"):
            os.symlink(found.stdout.strip(), laptop_bin / tool)
    yield {"PATH": f"{server.bindir}:{laptop_bin}", "SLURM_CONF": "", "XDG_RUNTIME_DIR": str(short_dir)}
    control = short_dir / f"meshrun-ssh-{os.getuid()}"
    if control.is_dir():
        subprocess.run(
            ["/usr/bin/ssh", "-F", str(server.client_config), "-o", f"ControlPath={control}/%C", "-O", "exit",
             "-p", str(server.port), f"{server.user}@127.0.0.1"],
            capture_output=True, check=False, timeout=20,
        )  # fmt: skip


def test_status_and_cancel_of_a_run_made_with_cluster_login_ask_the_login_node(
    login_node: tuple[SshServer, Path], tmp_path: Path, laptop_env: dict[str, str]
) -> None:
    server, remote_bin = login_node
    calls = tmp_path / "calls.jsonl"
    accounting = "4242|tiny-remote|RUNNING|1000|1010|Unknown|1|node1|cpu=2|cpu=2|0:0|None|debug|normal|u|a"
    record = "4242|tiny-remote|RUNNING|00:01:00|1|node1|0:0"  # SACCT_FIELDS, what cancel reads
    stand_in(
        remote_bin,
        "sacct",
        calls,
        f"case \"$*\" in *Elapsed*) echo '{record}';; *) echo '{accounting}';; esac",
    )
    stand_in(remote_bin, "scancel", calls, "exit 0")
    try:
        run = run_dir_with_login(tmp_path, server.login, "4242")
        env = laptop_env
        shown = meshrun("status", str(run), env=env)
        assert shown.returncode == 0, shown.stderr
        assert "4242" in shown.stdout and "RUNNING" in shown.stdout, shown.stdout
        cancelled = meshrun("cancel", str(run), env=env)
        assert cancelled.returncode == 0, cancelled.stderr
        assert "meshrun: cancelled" in cancelled.stdout and "(job 4242)" in cancelled.stdout
        argvs = [line.rstrip("\x1f").split("\x1f") for line in calls.read_text().splitlines()]
        assert [a[1] for a in argvs] == ["sacct", "sacct", "scancel"], argvs
        assert argvs[-1] == ["TF=", "scancel", "4242"]
        assert argvs[0][0] == "TF=%s"  # accounting's times as Unix seconds, set on the login node
        assert "-j" in argvs[0] and argvs[0][argvs[0].index("-j") + 1] == "4242"
    finally:
        for name in ("sacct", "scancel"):
            (remote_bin / name).unlink(missing_ok=True)


def test_status_of_a_run_whose_login_node_has_no_slurm_is_one_line(
    login_node: tuple[SshServer, Path], tmp_path: Path, laptop_env: dict[str, str]
) -> None:
    server, _ = login_node
    run = run_dir_with_login(tmp_path, server.login, "4243")
    shown = meshrun("status", str(run), env=laptop_env)
    assert shown.returncode == 3, shown
    lines = shown.stderr.strip().splitlines()
    assert lines == [lines[-1]] and lines[0].startswith("meshrun: no Slurm on the login node 127.0.0.1"), (
        lines
    )


@pytest.mark.parametrize(
    ("login", "refused"),
    [
        ("'-oProxyCommand=touch /tmp/meshrun-ssh-pwned'", "cluster.login="),
        ("alice@host:70000", "cluster.login="),
        ("'alice@host;id'", "cluster.login="),
        # A good login: the runs root (the default, relative) is not a path on the cluster.
        ("alice@host:2222", "launcher.runs_root='runs' is invalid: names the runs root on the cluster"),
    ],
)
def test_a_run_refused_for_its_cluster_login_leaves_nothing_behind(
    tmp_path: Path, login: str, refused: str
) -> None:
    proc, cwd, calls = fake_sbatch_cli(tmp_path, "cluster=testcluster", f"cluster.login={login}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert f"meshrun: error: {refused}" in proc.stderr and "Traceback" not in out
    assert sorted(cwd.rglob("*")) == [], "left behind"
    assert not calls.exists(), "sbatch was called"
    assert not Path("/tmp/meshrun-ssh-pwned").exists()


# --- the code snapshot shipped to the login node's store ---------------------


def local_entry(tmp_path: Path) -> Path:
    """A project's code store entry made here as a submission makes it (launcher/run/codesnap.py)."""
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "train.py").write_text("print('train')\n")
    (project / "pkg" / "util.py").write_text("X = 1\n" * 20000)
    (project / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (project / "run.sh").chmod(0o755)
    return local_entry_of(tmp_path)


def local_entry_of(tmp_path: Path) -> Path:
    """The entry of ``tmp_path/project`` as it is now."""
    from launcher.config.compose import compose
    from launcher.run import codesnap

    project = tmp_path / "project"
    codesnap.forget_listings()  # a new submission from this process
    cfg = compose([f"launcher.runs_root={tmp_path / 'runs'}"])
    cfg.job.kind, cfg.job.workdir = "script", str(project)
    _, tree = codesnap.plan_code(cfg)
    assert tree is not None
    path, _ = codesnap.store_tree(tree, codesnap.store_root(cfg), "project")
    return Path(path).parent


def remote_files(entry: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(entry)): (p.read_bytes(), p.stat().st_mode & 0o777)
        for p in sorted(entry.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def test_the_code_is_shipped_once_and_checked_on_the_login_node(
    laptop: Login, tmp_path: Path, short_dir: Path
) -> None:
    from launcher.run.codeship import ship_entry

    entry = local_entry(tmp_path)
    store = short_dir / "cluster-runs" / ".code"
    first = ship_entry(laptop, entry, str(store))
    assert first.entry == f"{store}/{laptop.user}/{entry.name}"
    assert first.files == 3 and first.bytes_sent > 6000
    assert remote_files(Path(first.entry)) == remote_files(entry)  # contents and read-only modes
    again = ship_entry(laptop, entry, str(store))
    assert (again.entry, again.files, again.bytes_sent) == (first.entry, 0, 0)  # nothing sent
    # A damaged entry (an edited file, a file added) is replaced, never used.
    util = Path(first.entry) / "project" / "pkg" / "util.py"
    util.chmod(0o644)
    util.write_text("X = 2\n")
    assert ship_entry(laptop, entry, str(store)).files == 3
    assert remote_files(Path(first.entry)) == remote_files(entry)
    (Path(first.entry) / "project" / "planted.py").write_text("import os\n")
    assert ship_entry(laptop, entry, str(store)).files == 3
    assert not (Path(first.entry) / "project" / "planted.py").exists()
    assert [p.name for p in Path(first.entry).parent.iterdir() if ".ship-" in p.name] == []


def test_a_changed_tree_sends_only_its_changed_files(laptop: Login, tmp_path: Path, short_dir: Path) -> None:
    """After one shipment, a tree with a file changed, one added and one
    removed sends 2 files; the entry there holds exactly the new tree. A base
    edited there since is caught by the check and the entry sent whole."""
    from launcher.run.codeship import ship_entry

    store = short_dir / "cluster-runs" / ".code"
    first = local_entry(tmp_path)
    assert ship_entry(laptop, first, str(store)).files == 3
    project = tmp_path / "project"
    (project / "train.py").write_text("print('train v2')\n")
    (project / "pkg" / "new.py").write_text("Y = 2\n")
    (project / "run.sh").unlink()
    second = local_entry_of(tmp_path)
    assert second.name != first.name
    delta = ship_entry(laptop, second, str(store))
    assert delta.files == 2 and delta.bytes_sent < 40_000, delta  # util.py (120 kB) was copied there
    assert delta.entry == f"{store}/{laptop.user}/{second.name}"
    assert remote_files(Path(delta.entry)) == remote_files(second)
    # The base changed there (another session edited it): the delta fails its check, sent whole.
    (project / "train.py").write_text("print('train v3')\n")
    third = local_entry_of(tmp_path)
    util = Path(delta.entry) / "project" / "pkg" / "util.py"
    util.chmod(0o644)
    util.write_text("X = 666\n")
    whole = ship_entry(laptop, third, str(store))
    assert whole.files == 3 and remote_files(Path(whole.entry)) == remote_files(third)
    assert [p.name for p in Path(whole.entry).parent.iterdir() if ".ship-" in p.name] == []


def test_a_store_that_cannot_be_written_is_one_line_and_leaves_nothing(
    laptop: Login, tmp_path: Path, short_dir: Path
) -> None:
    from launcher.run.codeship import ship_entry

    entry = local_entry(tmp_path)
    (short_dir / "a-file").write_text("")
    with pytest.raises(remote.RemoteError) as info:
        ship_entry(laptop, entry, str(short_dir / "a-file" / ".code"))
    msg = str(info.value)
    assert msg.startswith("127.0.0.1: the code could not be written to") and "\n" not in msg
    assert sorted(p.name for p in short_dir.iterdir()) == ["a-file", f"meshrun-ssh-{os.getuid()}"]


@pytest.mark.parametrize("store", ["runs/.code", "/shared/my runs", "/shared/../etc", "/a;b", "~/runs", "/"])
def test_a_remote_store_path_outside_the_form_is_refused_before_any_connection(
    tmp_path: Path, store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launcher.config.validate import ConfigError
    from launcher.run.codeship import ship_entry

    entry = local_entry(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-ssh-here"))  # a connection would fail differently
    with pytest.raises(ConfigError, match=r"^the remote code store=.* is invalid: an absolute path"):
        ship_entry(Login("alice", "login1", 0), entry, store)


def test_a_dry_run_from_the_laptop_asks_the_login_node_not_this_machine(
    login_node: tuple[SshServer, Path], tmp_path: Path, laptop_env: dict[str, str]
) -> None:
    server, _ = login_node
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "cluster=testcluster", f"cluster.login={server.login}",
         f"launcher.run_dir={tmp_path / 'run'}", "launcher.dry_run=true"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, **laptop_env, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("meshrun: Slurm could not be asked")]
    assert len(said) == 1 and "no Slurm on the login node 127.0.0.1" in said[0], proc.stdout[-2000:]
    assert not (tmp_path / "run").exists()


def test_logs_of_a_run_whose_job_writes_on_the_cluster_say_where_not_no_output(tmp_path: Path) -> None:
    run = run_dir_with_login(tmp_path, "alice@login1:2222", "4244")
    shown = meshrun("status", "logs", str(run), env={})
    assert shown.returncode == 0, shown.stderr
    assert (
        "job 4244: no output here; the job writes it on the cluster behind alice@login1:2222" in shown.stdout
    )


def test_a_local_manifest_whose_digest_is_not_a_sha256_is_never_shipped(tmp_path: Path) -> None:
    from launcher.config.validate import ConfigError
    from launcher.run.codeship import ship_entry

    entry = local_entry(tmp_path)
    meta = entry / "snapshot.json"
    meta.chmod(0o600)
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "digest": "x; touch /tmp/meshrun-ssh-pwned"}))
    with pytest.raises(ConfigError, match="not a code store manifest"):
        ship_entry(Login("alice", "login1", 0), entry, "/shared/runs/.code")


# --- a run submitted from the laptop (launcher/entry/sshsubmit.py) ------------


def submit_from_laptop(
    server: SshServer, laptop_env: dict[str, str], short_dir: Path, *overrides: str
) -> subprocess.CompletedProcess[str]:
    """``python -m launcher`` on the laptop with cluster.login; its own code store under short_dir."""
    return subprocess.run(
        [sys.executable, "-m", "launcher", "cluster=testcluster", f"cluster.login={server.login}", *overrides],
        capture_output=True, text=True, timeout=120, cwd=short_dir,
        env={**os.environ, **laptop_env, "XDG_CACHE_HOME": str(short_dir / "cache"), "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("meshrun: error: ")]


def test_a_submission_to_a_login_node_without_slurm_is_one_line_and_writes_nothing_there(
    login_node: tuple[SshServer, Path], laptop_env: dict[str, str], short_dir: Path
) -> None:
    server, _ = login_node
    runs = short_dir / "cluster-runs"
    proc = submit_from_laptop(server, laptop_env, short_dir, f"launcher.runs_root={runs}")
    said = error_lines(proc)
    assert proc.returncode == 3 and len(said) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert said[0].startswith("meshrun: error: no Slurm on the login node 127.0.0.1: `command -v sbatch`")
    assert said[0].endswith("(nothing was submitted)"), said
    assert not runs.exists()  # no code, no run dir on the cluster's side


def test_an_unwritable_runs_root_or_a_missing_cluster_python_is_one_line_and_no_run_dir(
    login_node: tuple[SshServer, Path], laptop_env: dict[str, str], short_dir: Path
) -> None:
    server, remote_bin = login_node
    calls = short_dir / "sbatch_calls"
    stand_in(remote_bin, "sbatch", calls, "exit 1")  # the login node has Slurm now
    try:
        (short_dir / "a-file").write_text("")
        proc = submit_from_laptop(
            server, laptop_env, short_dir, f"launcher.runs_root={short_dir / 'a-file' / 'runs'}"
        )
        said = error_lines(proc)
        assert proc.returncode == 3 and len(said) == 1, proc.stderr[-2000:]
        assert said[0].startswith("meshrun: error: 127.0.0.1: the code could not be written to "), said
        assert "check that " in said[0] and said[0].endswith("(nothing was submitted)"), said
        # Written and shipped, but the login node has no such Python: one line naming the field.
        runs = short_dir / "cluster-runs"
        proc = submit_from_laptop(
            server, laptop_env, short_dir, f"launcher.runs_root={runs}", "cluster.python=/nonexistent/python3"
        )
        said = error_lines(proc)
        assert proc.returncode == 3 and len(said) == 1, proc.stderr[-2000:]
        assert said[0].startswith(
            "meshrun: error: 127.0.0.1: cluster.python='/nonexistent/python3' is not found there"
        ), said
        assert sorted(p.name for p in runs.iterdir()) == [".code"]  # the shipped code only, no run dir
        assert not calls.exists()  # sbatch never ran
    finally:
        (remote_bin / "sbatch").unlink()


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("launcher.runs_root=runs", "launcher.runs_root='runs'"),
        ("launcher.run_dir=/elsewhere/run", "launcher.run_dir='/elsewhere/run'"),
        ("launcher.run_dir=/shared/runs/../../etc", "launcher.run_dir='/shared/runs/../../etc'"),
        ("launcher.code=live", "launcher.code='live'"),
    ],
)
def test_a_submission_over_ssh_with_paths_it_cannot_use_is_refused_before_any_connection(
    override: str, field: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from launcher.config.compose import compose
    from launcher.config.validate import ConfigError
    from launcher.entry.sshsubmit import check_remote_submission

    monkeypatch.setenv("PATH", str(tmp_path / "no-ssh-here"))
    overrides = [
        "cluster=testcluster",
        "cluster.login=alice@login1",
        "launcher.runs_root=/shared/runs",
        override,
    ]
    cfg = compose(overrides)
    run_dir = cfg.launcher.run_dir or "/shared/runs/tiny/1"
    with pytest.raises(ConfigError) as info:
        check_remote_submission(cfg, run_dir)
    assert str(info.value).startswith(f"{field} is invalid: "), info.value


@pytest.mark.parametrize("python", ["python3; touch /tmp/meshrun-ssh-pwned", "-c", "py thon", "$(id)"])
def test_a_cluster_python_a_shell_would_read_is_refused_naming_the_field(python: str) -> None:
    from launcher.config.compose import compose
    from launcher.config.validate import ConfigError, check_cluster

    cfg = compose(["cluster=testcluster", "cluster.login=alice@login1"])
    cfg.cluster.python = python
    with pytest.raises(
        ConfigError, match=r"^cluster\.python=.* is invalid: must be a program name or a path"
    ):
        check_cluster(cfg)


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("alice@host;id:/shared/runs/x", "the run's login (LOGIN:RUN_DIR)="),
        ("alice@host:70000:/shared/runs/x", "the run's login (LOGIN:RUN_DIR)="),
        ("alice@host:/shared/runs/../x", "the run dir on the cluster must be an absolute path"),
    ],
)
def test_status_of_a_remote_run_given_a_bad_login_or_path_is_refused_before_any_connection(
    target: str,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from launcher.commands.status import main

    monkeypatch.setenv("PATH", str(tmp_path / "no-ssh-here"))
    monkeypatch.chdir(tmp_path)
    assert main(["cancel", target]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshrun: error: ") and said in err and err.count("\n") == 1, err


def test_the_remote_command_line_carries_each_override_as_one_word_and_no_credential(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from launcher.config.compose import compose
    from launcher.entry.sshsubmit import Sent, remote_command

    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-value")  # the laptop's: never on the line
    cfg = compose(["cluster=testcluster", "cluster.login=alice@login1", "launcher.runs_root=/shared/runs"])
    hostile = "launcher.name='a b; touch /tmp/meshrun-ssh-pwned' $(id)"
    sent = Sent("/shared/runs/.code/alice/" + "a" * 64, "/shared/runs/.code/alice/" + "b" * 64 + "/project")
    line = remote_command(
        cfg, "/shared/runs/x", sent, [hostile, "cluster.login=alice@login1", "train.lr=1e-3"]
    )
    words = shlex.split(line.split("&& exec ", 1)[1])
    assert words[:1] == ["env"] and "wandb-secret-value" not in line
    env = dict(w.split("=", 1) for w in words[1 : words.index("python3")])
    assert set(env) == {
        "PYTHONPATH",
        "PYTHONDONTWRITEBYTECODE",
        "MESHRUN_CONFIG_DIR",
        "MESHRUN_SUBMITTED_FROM",
    }
    assert words[words.index("python3") :] == [
        "python3", "-m", "launcher", hostile, "train.lr=1e-3", "cluster.login=", "launcher.run_dir=/shared/runs/x",
    ]  # fmt: skip


def script_job(tmp_path: Path, *overrides: str, cwd: Path | None = None) -> Any:
    """A checked script job for a cluster over SSH (check_script made its paths absolute)."""
    from launcher.config.compose import compose
    from launcher.plan.script import check_script

    cfg = compose(["cluster=testcluster", "cluster.login=alice@login1", "launcher.runs_root=/shared/runs",
                   "job=script", *overrides])  # fmt: skip
    here = os.getcwd()
    os.chdir(cwd or tmp_path)
    try:
        check_script(cfg)
    finally:
        os.chdir(here)
    return cfg


def test_a_script_job_over_ssh_runs_its_program_from_the_shipped_project(tmp_path: Path) -> None:
    """job.script relative to job.workdir or absolute inside it: on the cluster, its place in the
    shipped project; the typed paths are replaced on the remote line and kept for the record."""
    from launcher.entry.sshsubmit import Sent, check_remote_submission, remote_command

    project = tmp_path / "proj dir"
    (project / "sub").mkdir(parents=True)
    (project / "sub" / "train.py").write_text("print(1)\n")
    there = "/shared/runs/.code/alice/" + "c" * 64 + "/project"
    sent = Sent("/shared/runs/.code/alice/" + "a" * 64, project=there, project_digest="c" * 64)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for script, cwd in (("sub/train.py", elsewhere), (str(project / "sub" / "train.py"), tmp_path)):
        typed = [f"job.workdir={project}", f"job.script={script}", "job.args=[--steps,3]"]
        cfg = script_job(tmp_path, *typed, cwd=cwd)
        assert cfg.job.script == str(project / "sub" / "train.py")
        check_remote_submission(cfg, "/shared/runs/x")
        line = remote_command(cfg, "/shared/runs/x", sent, ["job=script", *typed])
        words = shlex.split(line.split("&& exec ", 1)[1])
        env = dict(w.split("=", 1) for w in words[1 : words.index("python3")])
        assert words[words.index("python3") :] == [
            "python3", "-m", "launcher", "job=script", "job.args=[--steps,3]", f"job.workdir='{there}'",
            f"job.script='{there}/sub/train.py'", "cluster.login=", "launcher.run_dir=/shared/runs/x",
        ]  # fmt: skip
        said = json.loads(env["MESHRUN_SUBMITTED_PROJECT"])
        assert said == {"workdir": str(project), "script": str(project / "sub" / "train.py"),
                        "overrides": ["job=script", *typed]}  # fmt: skip


def test_a_script_outside_the_project_is_refused_over_ssh_before_any_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launcher.config.validate import ConfigError
    from launcher.entry.sshsubmit import check_project_not_swept, check_remote_submission

    monkeypatch.setenv("PATH", str(tmp_path / "no-ssh-here"))
    (tmp_path / "proj").mkdir()
    (tmp_path / "train.py").write_text("print(1)\n")
    cfg = script_job(tmp_path, f"job.workdir={tmp_path / 'proj'}", f"job.script={tmp_path / 'train.py'}")
    with pytest.raises(
        ConfigError, match=r"^job\.script='.*/train\.py' is invalid: lies outside job\.workdir="
    ):
        check_remote_submission(cfg, "/shared/runs/x")
    # A sweep ships one project: a swept program is refused naming the field.
    cfg = script_job(tmp_path, f"job.script={tmp_path / 'train.py'}")
    with pytest.raises(ConfigError, match=r"^job\.script='a.py,b.py' is invalid: one program and project"):
        check_project_not_swept(cfg, ["job.script=a.py,b.py"])
    # A pipeline's project is not shipped: refused naming job.workdir.
    with pytest.raises(ConfigError, match=r"^job\.workdir=.* is invalid: a pipeline's project dir"):
        check_remote_submission(cfg, "/shared/runs/x", project=False)


def test_a_sweep_mixing_a_cluster_over_ssh_with_other_points_is_refused_whole(tmp_path: Path) -> None:
    """Sent whole, its dry-run point would run on the login node: refused before any connection."""
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "-m", "cluster=testcluster", "cluster.login=alice@login1",
         "launcher.runs_root=/shared/runs", "launcher.dry_run=true,false", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PATH": str(tmp_path / "no-ssh-here"), "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "meshrun: error: a sweep whose points go to a cluster behind its login node" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "sweep").exists()


def test_a_connection_lost_while_the_login_node_submits_is_checked_there_again(
    login_node: tuple[SshServer, Path], laptop_env: dict[str, str], short_dir: Path
) -> None:
    """The connection drops while meshrun runs on the login node (its sshd
    session killed): the laptop asks again over a new connection. A run dir
    whose job.json names a job there: submitted, said so, exit 0; none: one
    line saying it is not known and how to check, exit 3."""
    server, remote_bin = login_node
    calls = short_dir / "sbatch_calls"
    stand_in(remote_bin, "sbatch", calls, "exit 1")  # the login node has Slurm
    # cluster.python there: records the job (when told to) as meshrun would, then the connection drops.
    py = remote_bin / "python-drops"
    py.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in launcher.run_dir=*) d="${a#launcher.run_dir=}";; esac; done\n'
        'if [ -e "$d.record" ]; then mkdir -p "$d/slurm" && printf \'{"job_id": "4242"}\' > "$d/slurm/job.json"; fi\n'
        "kill -9 $PPID\n"  # the session's sshd: the laptop's connection is gone
        "sleep 5\n"
    )
    py.chmod(0o755)
    runs = short_dir / "cluster-runs"
    try:
        for recorded in (True, False):
            run = runs / ("went" if recorded else "unknown")
            runs.mkdir(exist_ok=True)
            if recorded:
                Path(f"{run}.record").write_text("")
            proc = submit_from_laptop(
                server, laptop_env, short_dir, f"launcher.runs_root={runs}", f"launcher.run_dir={run}",
                f"cluster.python={py}",
            )  # fmt: skip
            if recorded:
                assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
                assert "meshrun: submitted job 4242 (the connection was lost before" in proc.stdout, (
                    proc.stdout
                )
                assert f"meshrun: follow it from here: meshrun status {server.login}:{run}" in proc.stdout
            else:
                said = error_lines(proc)
                assert proc.returncode == 3 and len(said) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
                assert "whether Slurm took it is not known" in said[0], said
                assert f"check with `meshrun status {server.login}:{run}`" in said[0], said
                assert not run.exists()
    finally:
        (remote_bin / "sbatch").unlink()
        py.unlink()


def test_the_api_ships_the_project_as_it_is_at_each_call(
    login_node: tuple[SshServer, Path],
    laptop: Login,
    tmp_path: Path,
    short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A notebook's second ``api.submit`` after an edit ships the edited
    project (a file added, one changed: only those 2 sent), never the first
    call's listing."""
    from launcher import api

    server, remote_bin = login_node
    stand_in(remote_bin, "sbatch", short_dir / "sbatch_calls", "exit 1")  # the login node has Slurm
    py = remote_bin / "python-submits"  # cluster.python there: records job 77 as meshrun would
    py.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in launcher.run_dir=*) d="${a#launcher.run_dir=}";; esac; done\n'
        'mkdir -p "$d/slurm" && printf \'{"job_id": "77"}\' > "$d/slurm/job.json"\n'
        "echo 'meshrun: submitted job 77'\n"
    )
    py.chmod(0o755)
    project, runs = tmp_path / "proj", short_dir / "cluster-runs"
    project.mkdir()
    (project / "train.py").write_text("print('v1')\n")
    (project / "data.py").write_text("D = 1\n" * 20000)
    monkeypatch.chdir(project)
    monkeypatch.setenv("XDG_CACHE_HOME", str(short_dir / "cache"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    typed = ["cluster=testcluster", "job=script", "job.script=train.py", f"launcher.runs_root={runs}",
             f"cluster.login={server.login}", f"cluster.python={py}"]  # fmt: skip

    def shipped(run: str) -> tuple[Path, str]:
        handle = api.submit([*typed, f"launcher.run_dir={runs / run}"])
        assert handle.job_id == "77"
        line = next(
            ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("meshrun: submitted over")
        )
        return Path(line.split(" in ", 1)[1].split(" (", 1)[0]), line

    try:
        first, _ = shipped("a")
        (project / "train.py").write_text("print('v2')\n")
        (project / "extra.py").write_text("E = 1\n")
        second, said = shipped("b")
        assert second != first and (second / "extra.py").read_text() == "E = 1\n"
        assert (second / "train.py").read_text() == "print('v2')\n"
        assert "(2 files, " in said, said  # data.py was copied there from the first entry
        # This machine's store of shipped code is cleaned like a runs root's; the next call sends whole.
        store = short_dir / "cache" / "meshrun" / "ssh" / ".code"
        assert len(list(store.glob("*/" + "[0-9a-f]" * 64))) == 3  # meshrun's code, the project twice
        gc = subprocess.run(
            [sys.executable, "-m", "launcher.snapshot", "--gc", "--shipped", "--keep-days", "0"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "XDG_CACHE_HOME": str(short_dir / "cache"), "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert gc.returncode == 0 and f"3 entries removed, 0 kept in {store}" in gc.stdout, (
            gc.stdout + gc.stderr
        )
        assert list(store.glob("*/" + "[0-9a-f]" * 64)) == []
        (project / "train.py").write_text("print('v3')\n")
        _, said = shipped("c")
        assert "(3 files, " in said, said  # no base left here: the project sent whole
    finally:
        (remote_bin / "sbatch").unlink()
        py.unlink()
