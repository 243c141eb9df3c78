"""cluster.login (a Slurm cluster's login node over SSH) and the SSH
transport's exact argv: what is refused before any connection, what ssh is
given, what the login node's shell reads, and how each failure is said.
No process is started here; the transport against a real sshd is
tests/local/test_remote_ssh.py."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from harness import refused

from launcher.config.compose import compose
from launcher.config.validate import ConfigError, Login, parse_login
from launcher.plan.make import make_plan
from launcher.slurm.remote import no_slurm, remote_line, slurm_line, ssh_argv, ssh_failure

FORM = "user@host, user@host:port or host"

GOOD = [
    ("alice@login.cluster.example", Login("alice", "login.cluster.example", 0)),
    ("alice@10.0.0.5:2222", Login("alice", "10.0.0.5", 2222)),
    ("login1", Login("", "login1", 0)),
    ("j.doe_2@login-1:65535", Login("j.doe_2", "login-1", 65535)),
    ("my_alias:1", Login("", "my_alias", 1)),
]


@pytest.mark.parametrize(("value", "login"), GOOD)
def test_a_login_in_the_accepted_form_is_parsed(value: str, login: Login) -> None:
    assert parse_login(value) == login
    assert str(login) == value


BAD = [
    "-oProxyCommand=touch /tmp/pwned",  # an ssh option, not a host
    "-oProxyCommand=x",
    "alice@-oProxyCommand=x",
    "-l root",
    "alice@host;reboot",
    "alice@host && id",
    "alice@$(id)",
    "`id`@host",
    "alice@host|cat",
    "alice@ho st",
    " alice@host",
    "alice@host ",
    "alice@host:",
    "alice@host:22x",
    "alice@",
    "@host",
    "alice@bob@host",
    "alice@host/path",
    "alice@[::1]:22",
    "alice@host'",
    'alice@host"',
    "alice@host\\n",
    "ssh://alice@host",
]


@pytest.mark.parametrize("value", BAD)
def test_a_login_with_shell_characters_or_an_option_is_refused_naming_the_form(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_login(value)
    msg = str(info.value)
    assert msg.startswith(f"cluster.login={value!r} is invalid: must be {FORM}"), msg


@pytest.mark.parametrize("port", ["0", "65536", "99999"])
def test_a_port_out_of_range_is_refused(port: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_login(f"alice@host:{port}")
    msg = str(info.value)
    assert msg.startswith(f"cluster.login='alice@host:{port}' is invalid: its port {int(port)} is not")
    assert "1-65535" in msg and FORM in msg


def test_a_password_in_the_login_is_refused_and_never_echoed() -> None:
    with pytest.raises(ConfigError) as info:
        parse_login("alice:hunter2pw@host")
    msg = str(info.value)
    assert "hunter2pw" not in msg and msg.startswith("cluster.login='***' is invalid")
    assert "never a password" in msg and FORM in msg


def test_the_composed_config_refuses_a_bad_login_before_planning() -> None:
    msg = refused(["cluster=testcluster", "cluster.login='-oProxyCommand=x'"])
    assert msg.startswith("cluster.login='-oProxyCommand=x' is invalid") and FORM in msg
    msg = refused(["cluster=testcluster", "cluster.login=alice@host:0"])
    assert msg.startswith("cluster.login='alice@host:0' is invalid")


def test_a_login_on_a_local_cluster_is_refused() -> None:
    msg = refused(["cluster=local", "cluster.login=alice@host"])
    assert msg.startswith("cluster.login='alice@host' is invalid") and "cluster.kind=slurm" in msg


def test_a_good_login_plans_like_the_preset_without_it() -> None:
    with_login = make_plan(compose(["cluster=testcluster", "cluster.login=alice@login1:2222"]))
    without = make_plan(compose(["cluster=testcluster"]))
    assert with_login == without


CONTROL = Path("/run/user/1000/meshrun-ssh-1000")
OPTIONS = [
    "ssh",
    "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=10",
    "-o", "ControlMaster=auto",
    "-o", f"ControlPath={CONTROL}/%C",
    "-o", "ControlPersist=60",
]  # fmt: skip


def test_the_ssh_argv_is_batch_mode_multiplexed_and_ends_host_then_one_line() -> None:
    argv = ssh_argv(Login("alice", "login1", 2222), "squeue -h", CONTROL)
    assert argv == [*OPTIONS, "-p", "2222", "-l", "alice", "--", "login1", "squeue -h"]
    assert ssh_argv(Login("", "login1", 0), "true", CONTROL) == [*OPTIONS, "--", "login1", "true"]


def test_the_ssh_argv_never_turns_host_key_checking_off() -> None:
    argv = " ".join(ssh_argv(Login("alice", "login1", 22), "true", CONTROL))
    assert "StrictHostKeyChecking" not in argv and "UserKnownHostsFile" not in argv
    assert "PasswordAuthentication" not in argv  # BatchMode already refuses any prompt


def test_every_remote_argument_is_quoted_for_the_login_nodes_shell() -> None:
    hostile = ["scancel", "12; rm -rf ~", "$(id)", "`id`", "a'b", "with space", "*"]
    line = remote_line(hostile)
    assert shlex.split(line) == hostile  # the remote shell reads back exactly these words
    env_line = remote_line(["sacct", "-n"], {"SLURM_TIME_FORMAT": "%s"})
    assert shlex.split(env_line) == ["env", "SLURM_TIME_FORMAT=%s", "sacct", "-n"]


def test_a_slurm_line_checks_the_command_exists_then_execs_it() -> None:
    line = slurm_line(["sacct", "-j", "1;id"])
    assert line == "command -v sacct >/dev/null 2>&1 || exit 127; exec sacct -j '1;id'"


def test_only_slurm_commands_go_through_the_slurm_line() -> None:
    with pytest.raises(ValueError, match="not a Slurm command"):
        slurm_line(["rm", "-rf", "/"])


LOGIN = Login("alice", "login1", 2222)


@pytest.mark.parametrize(
    ("stderr", "says"),
    [
        (
            "ssh: connect to host login1 port 2222: Connection refused\r\n",
            "cannot reach login1 port 2222 over SSH (ssh: connect to host login1 port 2222: Connection refused)",
        ),
        (
            "ssh: Could not resolve hostname login1: Name or service not known\n",
            "cannot reach login1 port 2222",
        ),
        ("alice@login1: Permission denied (publickey).\n", "login1 port 2222 refused the SSH login of alice"),
        ("Host key verification failed.\n", "its SSH host key is not in your known_hosts"),
    ],
)
def test_each_ssh_failure_is_one_line_naming_the_host_and_the_fix(stderr: str, says: str) -> None:
    msg = ssh_failure(LOGIN, stderr)
    assert msg is not None and "\n" not in msg and says in msg, msg
    assert "ssh -p 2222 alice@login1" in msg  # what to try by hand


def test_a_remote_programs_own_exit_255_is_not_taken_for_an_ssh_failure() -> None:
    assert ssh_failure(LOGIN, "sacct: error: something of Slurm's own\n") is None


def test_no_slurm_on_the_login_node_names_the_host_and_the_fix() -> None:
    msg = no_slurm(LOGIN, "sbatch")
    assert msg.startswith("no Slurm on the login node login1: `command -v sbatch` finds nothing there")
    assert "PATH" in msg and "\n" not in msg


def test_a_password_in_a_login_url_is_never_echoed_either() -> None:
    with pytest.raises(ConfigError) as info:
        parse_login("ssh://alice:hunter2pw@host")
    assert "hunter2pw" not in str(info.value)


def test_a_saved_run_with_a_hostile_login_is_refused_before_any_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import subprocess

    from launcher.views import runstate

    run = tmp_path / "run"
    (run / "slurm").mkdir(parents=True)
    spec = {"cfg": {"cluster": {"kind": "slurm", "login": "-oProxyCommand=touch /tmp/x"}}}
    (run / "spec.json").write_text(json.dumps(spec))
    (run / "slurm" / "job.json").write_text('{"job_id": "7"}')

    def no_process(*a: object, **kw: object) -> None:
        raise AssertionError(f"a process was started: {a}")

    monkeypatch.setattr(subprocess, "run", no_process)
    with pytest.raises(ConfigError, match=r"^cluster.login='-oProxyCommand=touch /tmp/x' is invalid"):
        runstate.table(run)
    with pytest.raises(ConfigError, match=r"^cluster.login="):
        runstate.cancel_counts(run)


def test_runs_are_asked_about_per_cluster_and_an_empty_login_is_this_machine(tmp_path: Path) -> None:
    import json

    from launcher.views.runstate import by_login

    dirs = {}
    for name, login in (("a", ""), ("b", "alice@login1"), ("c", "alice@login1"), ("d", None)):
        d = tmp_path / name
        d.mkdir()
        if login is not None:
            (d / "spec.json").write_text(json.dumps({"cfg": {"cluster": {"login": login}}}))
        dirs[name] = str(d)
    got = by_login({dirs["a"]: ["3"], dirs["b"]: ["2", "1"], dirs["c"]: ["1", "5"], dirs["d"]: ["4"]})
    assert got == {"": ["3", "4"], "alice@login1": ["1", "2", "5"]}


def test_a_dry_runs_slurm_checks_ask_the_login_node_and_test_only_reads_the_script_on_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    from launcher.config.spec import RunSpec
    from launcher.slurm import cluster

    answers = {
        ("scontrol", "-o", "show", "partition"): "PartitionName=research Nodes=node[1-4] TotalNodes=4 "
        "MaxNodes=UNLIMITED MaxTime=UNLIMITED AllowQos=ALL AllowAccounts=ALL",
        ("sacctmgr", "-n", "-P", "show", "qos"): "research|||||||",
        ("sacctmgr", "-n", "-P", "show", "assoc"): "research|alice|research",
        ("scontrol", "-o", "show", "node"): "NodeName=node1 Gres=gpu:8",
        (
            "sbatch",
            "--test-only",
        ): "sbatch: Job 5 to start at 2026-12-06T05:00:00 using 2 processors on nodes node1",
    }
    calls: list[tuple[list[str], str, str | None]] = []

    def fake_run(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        calls.append((args, str(kw.get("login", "")), kw.get("stdin")))  # type: ignore[arg-type]
        out = next((v for k, v in answers.items() if tuple(args[: len(k)]) == k), "")
        return subprocess.CompletedProcess(
            args, 0, "" if args[0] == "sbatch" else out, out if args[0] == "sbatch" else ""
        )

    monkeypatch.setattr(cluster, "run", fake_run)
    cfg = compose(
        ["cluster=testcluster", "qos=research", "cluster.login=alice@login1:2222", "launcher.exclusive=false"]
    )
    spec = RunSpec(cfg, make_plan(cfg), str(tmp_path / "run"))
    cluster.check_request(spec)
    said = cluster.test_only(spec)
    assert said.startswith("Job 5 to start at")
    assert calls and all(login == "alice@login1:2222" for _, login, _ in calls), calls
    assert ["user=alice" in a for a, _, _ in calls if a[:2] == ["sacctmgr", "-n"] and "assoc" in a] == [True]
    sbatch = [(a, stdin) for a, _, stdin in calls if a[0] == "sbatch"]
    assert sbatch[0][0] == ["sbatch", "--test-only"] and str(sbatch[0][1]).startswith("#!/bin/bash")
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_the_socket_folder_is_private_and_one_others_may_enter_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from launcher.slurm.remote import RemoteError, control_dir

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    made = control_dir()
    assert made == tmp_path / f"meshrun-ssh-{os.getuid()}" and made.stat().st_mode & 0o777 == 0o700
    made.chmod(0o755)  # another user could reach a logged-in connection's socket
    with pytest.raises(RemoteError, match=r"is not a private directory of yours.*remove it"):
        control_dir()
    made.rmdir()
    made.symlink_to(tmp_path)  # a link planted in its place
    with pytest.raises(RemoteError, match="is not a private directory"):
        control_dir()
