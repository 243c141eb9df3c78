"""``meshrun nodes`` (a subprocess) on a poisoned bad-node ledger: a non-numeric
time does not break it, ``--drain`` runs scontrol for the checked names only
(issue 35, item 2; the rest: tests/unit/test_ops_hardening.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import poisoned_ledger

from launcher.config import nodeledger

ROOT = Path(__file__).resolve().parents[2]


def _nodes(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", "nodes", f"--runs-root={tmp_path}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def test_meshrun_nodes_and_drain_use_only_checked_names(tmp_path: Path) -> None:
    """A non-numeric time does not break ``meshrun nodes``; ``--drain`` runs
    scontrol for node4 only (a fake scontrol records its argv: draining the
    shared test cluster's nodes is not a test's to do)."""
    import time

    poisoned_ledger(tmp_path / nodeledger.LEDGER_FILE, time.time())
    out = _nodes(tmp_path, "--min-faults=1")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("meshrun: warning:") == 1 and "line 2: time 'yesterday'" in out.stderr
    assert "node4: 2 fault(s)" in out.stdout and "touch" not in out.stdout and "gpu[" not in out.stdout
    bin_dir, log = tmp_path / "bin", tmp_path / "scontrol.log"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\nprintf "%s|" "$@" >> {log}\necho >> {log}\n')
    (bin_dir / "scontrol").chmod(0o755)
    out = _nodes(tmp_path, "--min-faults=1", "--drain", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert out.returncode == 0, out.stderr
    assert log.read_text().splitlines() == [
        "update|NodeName=node4|State=DRAIN|Reason=meshrun: 2 fault(s) (hang), last run r2|"
    ]
    from launcher.nodecheck.ledgerview import drain_command

    with pytest.raises(ValueError, match="not a Slurm host name"):
        drain_command("gpu[001-512]", [{"cause": "hang"}])
