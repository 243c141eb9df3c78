"""Heartbeats aggregated per node (launcher/config/health.py: NodeWriter):
real rank processes write node-local heartbeats, the node's writer one file
per node in the run dir; the supervisor's HangWatch finds a stopped rank on
a node whose file stays fresh, and every rank of a node whose writer died.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_node_heartbeats.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

from launcher.config.health import NODE_HEARTBEAT_ENV, read_heartbeats


def test_extra_fields_survive_and_old_rank_files_still_read(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from launcher.config.health import NodeWriter, heartbeat_path

    monkeypatch.setenv(NODE_HEARTBEAT_ENV, str(tmp_path / "local"))
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    run = tmp_path / "run"
    (run / "heartbeats").mkdir(parents=True)
    rec = {"rank": 5, "node": "n1", "phase": "step", "step": 3, "time": time.time(), "probe_s": 0.25}
    path = heartbeat_path(run, 5)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rec))
    (path.parent / "rank6.json").write_text('{"rank": 6, "ph')  # torn: skipped
    NodeWriter(run).flush()
    # An older run dir's per-rank file is read beside the node files.
    old = {"rank": 1, "node": "n0", "phase": "step", "step": 2, "time": 1.0}
    (run / "heartbeats" / "rank1.json").write_text(json.dumps(old))
    assert read_heartbeats(run) == {5: rec, 1: old}
    assert read_heartbeats(tmp_path / "nowhere") == {}


def test_a_killed_ranks_file_from_an_earlier_job_is_not_read_by_the_next(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A rank SIGKILLed leaves its node-local file (only an all-done node
    removes its folder). A new job in the same run dir path (deleted and
    started again) read it and ended its own ranks as hung at once (found by
    scripts/bench_forecast.py): each job has its own folder."""
    from launcher.config.health import NodeWriter, write_heartbeat

    run = tmp_path / "run"
    monkeypatch.setenv(NODE_HEARTBEAT_ENV, str(tmp_path / "local"))
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    write_heartbeat(run, 1, "step", 60)  # the old job's rank 1, killed: never "done"
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    write_heartbeat(run, 0, "startup", 0)
    (run / "heartbeats").mkdir(parents=True)
    NodeWriter(run).flush()
    node = json.loads((run / "heartbeats" / "node-node1.json").read_text())
    assert list(node["ranks"]) == ["0"] and node["ranks"]["0"]["job"] == "42"
    assert set(read_heartbeats(run)) == {0}


def test_a_completed_rank_0_waits_for_a_node_peer_that_has_not_beaten_yet(
    tmp_path: Path, monkeypatch
) -> None:  # noqa: ANN001
    from launcher.config.health import ATTEMPT_ENV, write_heartbeat
    from launcher.taskwrap.progress import Heartbeats

    monkeypatch.setenv(NODE_HEARTBEAT_ENV, str(tmp_path / "local"))
    monkeypatch.setenv(ATTEMPT_ENV, "0.0")
    run = tmp_path / "run"
    beats = Heartbeats(run, [0], True, stopping=lambda: False, node_ranks=2)
    soon, past = time.monotonic() + 30, time.monotonic() - 1
    # Rank 1 has not beaten yet: it may be starting (until the deadline), then it is not waited for.
    assert beats.node_peers_running(soon) and not beats.node_peers_running(past)
    write_heartbeat(run, 1, "startup", 0)  # this process stands for rank 1's live task
    assert beats.node_peers_running(past)
    write_heartbeat(run, 1, "done", 0)
    assert not beats.node_peers_running(soon)
    # A task alone on its node (torchrun: one task reports the node's ranks) waits for nobody.
    assert not Heartbeats(run, [0, 1], True, stopping=lambda: False, node_ranks=2).node_peers_running(soon)
