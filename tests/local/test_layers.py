"""The shape of the code stays as docs/ARCHITECTURE.md draws it: no import
circle, no upward import between launcher's layers or train/'s packages, train/ reading only the
contract (launcher.config), launcher never importing train/; no function over
80 lines and no module over 550.
Tests that start no process: tests/unit/test_layers_units.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_code_has_no_circle_and_no_upward_import() -> None:
    p = subprocess.run(
        [sys.executable, "scripts/import_graph.py"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 violations" in p.stdout
