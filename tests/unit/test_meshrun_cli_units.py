"""``meshrun``: one command family (launcher/cli/, the pyproject console
script). ``meshrun --help`` lists every command, each command's ``--help``
works, and a command does what its ``python -m`` module does.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_meshrun_cli.py."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_console_script_is_declared() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.scripts]\n", 1)[1].split("\n[", 1)[0]
    assert [x for x in section.splitlines() if x and not x.startswith("#")] == [
        'meshrun = "launcher.cli:main"'
    ]


def test_a_command_whose_module_is_missing_says_so(monkeypatch, capsys) -> None:
    from launcher import cli

    monkeypatch.setitem(cli.COMMANDS, "image", cli.Command("launcher.no_such_module", "build images"))
    assert cli.main(["image", "build"]) == 2
    err = capsys.readouterr().err
    assert "'image' is not available in this version (launcher.no_such_module is not installed)" in err
