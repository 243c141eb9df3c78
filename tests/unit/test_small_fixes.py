"""Small things a new user met: status's --help names its other actions, and
meshrun nodes says plainly when no node is excluded."""

from __future__ import annotations

import pytest

from launcher.commands import nodes, status


def test_status_help_names_logs_and_cancel(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        status.main(["--help"])
    out = capsys.readouterr().out
    assert "python -m launcher.status logs PATH" in out and "python -m launcher.status cancel" in out


def test_nodes_with_an_empty_ledger_says_none_is_excluded(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert nodes.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no node is excluded" in out and "no such node" not in out
