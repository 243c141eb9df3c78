"""``meshrun fleet LOGIN:/RUNS_ROOT`` and ``meshrun init --login``: what is
refused before any connection (the field named), the preset's Python found
for a login, and the login node's fleet JSON read back as the same view."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.validate import ConfigError, Login
from launcher.views.fleetrows import FleetView, RunRow, totals
from launcher.views.fleettext import format_view
from launcher.views.remotefleet import fleet_target, preset_python, remote_fleet, view_from_json

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # PATH without ssh: anything that tried to connect would fail differently.
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args], capture_output=True, text=True, timeout=60,
        env={"PATH": "/nonexistent", "PYTHONPATH": str(REPO), **(env or {})},
    )  # fmt: skip


def test_a_fleet_target_is_a_login_and_an_absolute_runs_root() -> None:
    assert fleet_target("alice@login.example:2222:/shared/runs/") == (
        Login("alice", "login.example", 2222),
        "/shared/runs",
    )
    assert fleet_target("runs") is None and fleet_target("/abs/runs") is None


@pytest.mark.parametrize(
    "target, field",
    [
        ("a;b@host:/runs", "RUNS_ROOT's login"),
        ("-oProxyCommand=x@h:/runs", "RUNS_ROOT's login"),
        ("alice@h:70000:/runs", "RUNS_ROOT's login"),
        ("alice@h:/", "RUNS_ROOT="),
        ("alice@h:/runs/../etc", "RUNS_ROOT="),
        ("alice@h:/runs $(id)", "RUNS_ROOT="),
    ],
)
def test_a_bad_fleet_target_is_refused_naming_the_field(target: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace("(", r"\(").replace("$", r"\$")):
        fleet_target(target)


def test_the_command_refuses_bad_input_before_any_connection() -> None:
    out = cli("fleet", "--python", "py;rm", "alice@h:/runs")
    assert out.returncode == 2 and "--python='py;rm' is invalid" in out.stderr, out.stderr
    out = cli("fleet", "alice@h:/runs", "--prom", "x.prom")
    assert out.returncode == 2 and "--prom" in out.stderr, out.stderr
    out = cli("init", "--login=-oProxyCommand=touch /tmp/x")
    assert out.returncode == 2 and "--login='-oProxyCommand=touch /tmp/x' is invalid" in out.stderr
    out = cli("init", "--python", "/opt/py")
    assert (
        out.returncode == 2 and "--python='/opt/py' is invalid: names the login node's Python" in out.stderr
    )


def test_a_local_folder_with_a_colon_stays_a_local_runs_root(tmp_path: Path) -> None:
    local = tmp_path / "h:" / "runs"
    local.mkdir(parents=True)
    assert remote_fleet(str(local), None) is None


def test_the_python_is_the_presets_with_that_login_else_python3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MESHRUN_CONFIG_DIR", str(tmp_path))
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "a.yaml").write_text("name: a\nlogin: alice@other\npython: /other/python\n")
    (tmp_path / "cluster" / "b.yaml").write_text("name: b\nlogin: alice@login:22\npython: /venv/bin/python\n")
    (tmp_path / "cluster" / "c.yaml").write_text("login: [not, a, login]\n")
    assert preset_python(Login("alice", "login", 22)) == "/venv/bin/python"
    assert preset_python(Login("bob", "login", 22)) == "python3"
    fleet = remote_fleet("alice@login:22:/runs", None)
    assert fleet is not None and (fleet.python, fleet.root, str(fleet)) == (
        "/venv/bin/python",
        "/runs",
        "alice@login:22:/runs",
    )


def test_the_login_nodes_json_is_the_same_view_here() -> None:
    row = RunRow("r1", "/runs/r1", "", "", "42", "RUNNING", model="tiny", step=3, steps=10, loss=1.5,
                 job_ids=["42"], goodput={"buckets_s": {"productive": 5.0}, "buckets_gpu_s": {},
                 "allocated_s": 6.0, "allocated_gpu_s": 0, "queue_wait_s": 1.0, "steps": {"reached": 3},
                 "final": False, "segments": []})  # fmt: skip
    view = FleetView("/runs", 1.0e9, [row], totals([row]), None, 1, None)
    back = view_from_json(json.loads(json.dumps(view.to_json())))
    assert back.runs[0].job_id == "42" and back.runs[0].goodput["buckets_s"] == {"productive": 5.0}
    assert format_view(back) == format_view(view)
