"""storage.save_every_steps=auto (launcher/config/saveauto.py): the
launcher's Young/Daly interval from the runs root's fault history or the
published prior, the trainer re-tuning it from measured saves
(train/checkpoint/autointerval.py), and ``meshrun status``'s P50 / P90
finish (launcher/views/runforecast.py).

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_save_auto.py."""

from __future__ import annotations

import json
from pathlib import Path


def test_a_corrupt_fault_history_is_skipped_counted_and_said(tmp_path: Path) -> None:
    """Torn lines and non-numeric fields in faults.jsonl / goodput.json: skipped,
    counted in what is printed, never a crash; the prior where nothing is left."""
    from launcher.perf.reliability import failure_rate
    from launcher.views.runforecast import _restart

    run = tmp_path / "tiny-local" / "r"
    run.mkdir(parents=True)
    (run / "goodput.json").write_text(json.dumps({"allocated_gpu_s": "lots"}))
    (run / "faults.jsonl").write_text(
        '{"cause": "node_failure", "action": "restart"}\n{"cause": "nod\n'
        '{"event": "resumed", "seconds_lost": "slow"}\n{"event": "resumed", "seconds_lost": 40}\n'
    )
    rate = failure_rate(tmp_path)
    assert "1 unreadable history record(s) skipped" in rate.source  # goodput.json's field
    assert (rate.faults, rate.gpu_hours) == (0, 0.0)  # its faults not counted without its hours
    assert _restart(run) == (40.0, "(measured, 1 resume(s))", 2)  # the torn line, the word
    (run / "faults.jsonl").write_text("{torn\n")
    assert _restart(run) == (600.0, "(prior)", 1)
    # No resume of its own: this cluster's, from the other runs under the root.
    other = tmp_path / "tiny-local" / "s"
    other.mkdir()
    (other / "faults.jsonl").write_text(
        '{"event": "resumed", "seconds_lost": 20}\n{"event": "resumed", "seconds_lost": 30}\n'
    )
    assert _restart(run, tmp_path) == (25.0, "(measured under the runs root, 2 resume(s))", 1)
