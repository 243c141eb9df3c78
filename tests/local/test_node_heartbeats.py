"""Heartbeats aggregated per node (launcher/config/health.py: NodeWriter):
real rank processes write node-local heartbeats, the node's writer one file
per node in the run dir; the supervisor's HangWatch finds a stopped rank on
a node whose file stays fresh, and every rank of a node whose writer died.
Tests that start no process: tests/unit/test_node_heartbeats_units.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.config.health import NODE_HEARTBEAT_ENV, read_heartbeats

ROOT = Path(__file__).resolve().parents[2]

RANK = """
import sys, time
from launcher.config.health import NodeWriter, write_heartbeat
run, rank, writer = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
if writer:
    NodeWriter(run, interval_s=0.2).start()
step = 0
while True:
    step += 1
    write_heartbeat(run, rank, "step", step)
    time.sleep(0.1)
"""


def _rank(run: Path, local: Path, rank: int, node: str, writer: bool) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        NODE_HEARTBEAT_ENV: str(local),
        "SLURMD_NODENAME": node,
        "MESHRUN_ATTEMPT": "0.0",
    }
    return subprocess.Popen(
        [sys.executable, "-c", RANK, str(run), str(rank), "1" if writer else "0"], env=env
    )


def _wait(cond, timeout: float = 20.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_stopped_rank_and_dead_node_writer_detected_through_node_files(tmp_path: Path) -> None:
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.selfheal.hangwatch import HangWatch

    run, local = tmp_path / "run", tmp_path / "local"
    (run / "heartbeats").mkdir(parents=True)
    cfg = compose(
        [
            "cluster=testcluster",
            "model=tiny",
            "cluster.nodes=2",
            "cluster.gpus_per_node=2",
            "launcher.hang_timeout_s=1.5",
        ]
    )
    watch = HangWatch(RunSpec(cfg, make_plan(cfg), str(run)), lambda s: None)
    assert watch.world == 4
    # node n1: ranks 0 (its writer) and 1; node n2: ranks 2 (its writer) and 3.
    procs = [_rank(run, local, r, "n1" if r < 2 else "n2", r % 2 == 0) for r in range(4)]
    try:
        _wait(lambda: sorted(read_heartbeats(run)) == [0, 1, 2, 3])
        assert sorted(p.name for p in (run / "heartbeats").iterdir()) == ["node-n1.json", "node-n2.json"]
        assert watch.stale(read_heartbeats(run), time.time(), time.time()) == {}
        # A torn node file and a partial local file are skipped, not fatal.
        (run / "heartbeats" / "node-n3.json").write_text('{"node": "n3", "ranks": {"7": {"ra')
        (run / "heartbeats" / "node-n4.json").write_text('["not", "a", "node"]')
        assert sorted(read_heartbeats(run)) == [0, 1, 2, 3]

        os.kill(procs[1].pid, signal.SIGSTOP)  # one silent rank; its node's writer is fine
        n1 = run / "heartbeats" / "node-n1.json"
        before = json.loads(n1.read_text())["time"]
        time.sleep(2.5)
        hbs = read_heartbeats(run)
        assert json.loads(n1.read_text())["time"] > before + 1.5  # the node file stays fresh
        stale = watch.stale(hbs, 0.0, time.time())
        assert sorted(stale) == [1] and stale[1]["node"] == "n1", stale

        procs[2].kill()  # node n2's writer dies: its file freezes, rank 3 beats on locally only
        procs[2].wait()
        n2 = run / "heartbeats" / "node-n2.json"
        frozen = n2.read_text()
        time.sleep(2.5)
        assert n2.read_text() == frozen
        assert sorted(watch.stale(read_heartbeats(run), 0.0, time.time())) == [1, 2, 3]
        # Nothing per rank on the shared dir: the ranks' own files are node-local.
        assert not list((run / "heartbeats").glob("rank*.json"))
        assert len(list(local.glob("meshrun-hb-*-n1/rank*.json"))) == 2
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()
