"""Units of the straggler watch without Slurm (launcher/selfheal/straggler.py): the
rule (peers' median, threshold, window, probes after a save not counted, a
node by its worst rank), the trainer's probe in the heartbeat, the scores
served to Prometheus, `meshrun nodes` showing a score, and refusals of the
fields. The cluster scenario is in tests/cluster/test_selfheal.py.
Tests that start no process: tests/unit/test_straggler_units.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config import nodeledger

ROOT = Path(__file__).resolve().parents[2]


def test_meshrun_nodes_shows_a_stragglers_score(tmp_path: Path) -> None:
    path = tmp_path / nodeledger.LEDGER_FILE
    nodeledger.append(path, {"node": "node3", "cause": "straggler", "score": 2.31, "run": "r1", "job": "9"})
    out = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "nodes", str(tmp_path), "--all"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert "straggler score 2.31  run r1 job 9" in out.stdout, out.stdout


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("launcher.straggler_threshold=1", "launcher.straggler_threshold=1.0 is invalid: must be > 1"),
        ("launcher.straggler_threshold=-2", "launcher.straggler_threshold=-2.0 is invalid: must be > 1"),
        ("launcher.straggler_window=0", "launcher.straggler_window=0 is invalid: must be >= 1"),
        ("launcher.straggler_probe_every_steps=-1", "launcher.straggler_probe_every_steps=-1 is invalid"),
        ("launcher.straggler_min_slow=6", "launcher.straggler_min_slow=6 is invalid: must be 1-5"),
        ("launcher.straggler=kill", "launcher.straggler='kill' is invalid: choose one of warn, replace, off"),
    ],
)
def test_bad_straggler_fields_refused_naming_them(override: str, message: str) -> None:
    from launcher.config.compose import compose
    from launcher.config.validate import ConfigError, validate

    with pytest.raises(ConfigError) as info:
        validate(compose(["cluster=testcluster", override]))
    assert message in str(info.value)
