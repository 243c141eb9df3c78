"""``meshrun rerun LOGIN:RUN_DIR`` and ``meshrun diff`` of runs on a cluster:
what is refused before any connection (the login, the path, a typed new run
dir), naming the field, and the remote line a rerun runs there. ``ssh`` is
made unfindable, so a connection tried would say "no ssh here" instead;
the real thing over sshd and the test cluster is
tests/cluster/test_remote_ssh_rerun.py."""

from __future__ import annotations

import shlex

import pytest

from launcher.commands import diff, rerun
from launcher.entry.sshsubmit import Sent, remote_env
from launcher.views.remoterun import code_line


@pytest.fixture(autouse=True)
def no_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")


def one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "no ssh here" not in err[0]  # refused before any connection
    return err[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["-oProxyCommand=x:/runs/a"], "the run's login (LOGIN:RUN_DIR)='-oProxyCommand=x' is invalid"),
        (["alice@host:70000:/runs/a"], "its port 70000 is not a TCP port 1-65535"),
        (["a;b@host:/runs/a"], "the run's login (LOGIN:RUN_DIR)='a;b@host' is invalid"),
        (["alice@host:/runs/../etc"], "the run dir on the cluster must be an absolute path"),
        (["alice@host:/runs/a", "launcher.run_dir=rel/dir"], "launcher.run_dir='rel/dir' is invalid"),
        (["alice@host:/runs/a", "launcher.run_dir=/runs/$(id)"], "launcher.run_dir='/runs/$(id)' is invalid"),
        (["alice@host:/runs/a", "cluster.login=bob@other"], "cluster.login='bob@other' is invalid"),
    ],
)
def test_a_bad_rerun_target_is_refused_naming_the_field_before_any_connection(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert rerun.main(argv) == 2
    line = one_error(capsys)
    assert line.startswith("meshrun: error: ") and says in line, line


@pytest.mark.parametrize(
    "pair",
    [["alice@host:/runs/a", "/nonexistent/here"], ["alice@host:/runs/a", "bob@host:/runs/b"]],
)
def test_a_diff_across_machines_is_refused_saying_what_is_compared(
    pair: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert diff.main(pair) == 2
    line = one_error(capsys)
    assert "meshrun: error: run_b: " in line and "give two LOGIN:RUN_DIR of one login node" in line, line


def test_a_diff_with_a_bad_target_names_the_login_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert diff.main(["--", "-oProxyCommand=x:/runs/a", "alice@host:/runs/b"]) == 2
    assert "the run's login (LOGIN:RUN_DIR)='-oProxyCommand=x'" in one_error(capsys)


def test_the_rerun_line_keeps_each_override_one_word_and_the_runs_own_code() -> None:
    hostile = "launcher.job_name='a b; $(touch /tmp/pwned) q'"
    env = remote_env(Sent("/runs/.code/u/e1", "/runs/.code/u/e2/project"), "/runs/.code/u/e1/meshrun")
    words = ["/opt/py", "-m", "launcher.rerun", "/runs/a", hostile, "train.steps=3"]
    line = code_line("/opt/py", "/runs/.code/u/e1/meshrun", words, env)
    guard, run = line.split("; ", 1)
    assert guard == "command -v /opt/py >/dev/null 2>&1 || exit 127"
    parsed = shlex.split(run)
    assert parsed[:3] == ["cd", "/", "&&"] and parsed[-6:] == words, parsed
    assert "PYTHONPATH=/runs/.code/u/e1/meshrun" in parsed
    assert "MESHRUN_CONFIG_DIR=/runs/.code/u/e2/project" in parsed


def test_a_sweeps_first_point_is_each_sweep_overrides_first_value_in_hydras_grammar() -> None:
    from launcher import api

    typed = ["model=tiny", "job.args=[--steps,2],[--steps,4]", "launcher.job_name='a b;$x',c",
             "train.steps=range(3,5)", "hydra.sweep.dir=/x", "hydra/launcher=basic"]  # fmt: skip
    assert api._first_point(typed) == ["model=tiny", "job.args=[--steps,2]", "launcher.job_name='a b;$x'",
                                       "train.steps=3"]  # fmt: skip


def test_an_api_sweep_over_ssh_that_would_submit_nothing_is_refused_before_any_connection() -> None:
    from launcher import api

    with pytest.raises(api.ConfigError, match=r"launcher.dry_run=true submits nothing"):
        api.sweep(["cluster=testcluster", "cluster.login=alice@host", "launcher.runs_root=/runs",
                   "launcher.dry_run=true", "train.steps=2,3"])  # fmt: skip
    with pytest.raises(api.ConfigError, match=r"hydra.sweep.dir='rel/sweep' is invalid"):
        api.sweep(["cluster=testcluster", "cluster.login=alice@host", "launcher.runs_root=/runs",
                   "train.steps=2,3", "hydra.sweep.dir=rel/sweep"])  # fmt: skip
