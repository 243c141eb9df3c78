"""Local runs end cleanly whatever happens (launcher/run/local.py,
launcher/run/runlock.py, train/observe/lifeline.py): a failing rank ends the whole run
within seconds, named, with its last log lines; ranks never outlive the
launcher; a run dir has one owner at a time. Real trainer, 2 gloo ranks.
Tests that start no process: tests/unit/test_local_lifetime_units.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from launcher.run.local import PEER_STOP_S, _Ranks
from launcher.run.runlock import own_run_dir

REPO = Path(__file__).resolve().parents[2]
SEQ, VOCAB = 64, 256  # model=tiny


def launcher(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "launcher", *args],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def train_procs(run_dir: Path) -> list[tuple[int, int, int]]:
    """(pid, parent pid, RANK) of every live `python -m train <run_dir>`
    process: the ranks and any data-loader workers (same command line)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes().split(b"\0")
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] == "Z" or b"train" not in argv or str(run_dir).encode() not in argv:
            continue  # a zombie (exited, not yet reaped) or another process
        rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), -1)
        found.append((int(d.name), int(stat[1]), rank))
    return found


def rank_pids(run_dir: Path, launcher_pid: int) -> dict[int, int]:
    """rank -> pid of the launcher's rank processes."""
    return {rank: pid for pid, ppid, rank in train_procs(run_dir) if ppid == launcher_pid}


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def trained_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return max((r["step"] for r in rows if "loss" in r), default=0)


def corrupt_tokens(root: Path, fail_step: int) -> Path:
    """A token dataset whose windows for rank 1 (of 2, no shuffle, global
    batch 8) at ``fail_step`` hold ids beyond the vocabulary: a damaged file
    that only that rank reads, which makes its embedding lookup raise."""
    n_samples = 200
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=SEQ * n_samples + 1, dtype=np.uint16)
    batch = fail_step - 1
    for sample in range(8 * batch + 4, 8 * batch + 8):  # rank 1's half of the global batch
        # Inside the window only: its first and last tokens are shared with rank 0's neighbours.
        tokens[SEQ * sample + 1 : SEQ * sample + SEQ] = 60000
    root.mkdir(parents=True)
    tokens.tofile(root / "s0.bin")
    index = {
        "format": "meshrun-tokens-v1",
        "dtype": "uint16",
        "vocab_size": VOCAB,
        "shards": [{"file": "s0.bin", "num_tokens": int(tokens.size)}],
    }
    (root / "index.json").write_text(json.dumps(index))
    return root


def test_stopping_peers_escalates_to_sigkill() -> None:
    """Ranks answer SIGTERM by trying to checkpoint, which cannot finish
    after a peer failed: the launcher's stop must not wait for them beyond
    PEER_STOP_S but SIGKILL them. Rank 0 here ignores SIGTERM entirely."""
    assert PEER_STOP_S <= 5
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    ranks = _Ranks()
    ranks.add(stubborn)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ready"
        ranks.add(subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"], start_new_session=True))
        code, failed = ranks.wait(deadline=time.monotonic() + 300)
        assert (code, failed) == (1, 1)
        assert stubborn.returncode == -signal.SIGKILL  # stop() escalated; nothing left
    finally:
        ranks.kill()


@pytest.mark.slow
def test_a_rank_that_raises_ends_the_run_naming_it(tmp_path: Path) -> None:
    """Rank 1 raises at step 3 (a corrupt data file) while rank 0 waits in a
    collective: the run ends within 30 s, non-zero, naming rank 1 with its
    traceback, and no rank is left."""
    data = corrupt_tokens(tmp_path / "tokens", fail_step=3)
    run_dir = tmp_path / "run"
    p = launcher(
        f"launcher.run_dir={run_dir}",
        "data=tokens",
        f"data.path={data}",
        "data.shuffle=false",
        "train.steps=20",
        "train.log_every_steps=1",
    )
    log1 = run_dir / "logs" / "rank1.log"
    wait_for(lambda: log1.exists() and "IndexError" in log1.read_text(), 240, "rank 1's error")
    failed_at = time.monotonic()
    out, err = p.communicate(timeout=60)
    assert time.monotonic() - failed_at < 30
    assert p.returncode == 1, out[-2000:] + err[-2000:]
    assert "meshrun: rank 1 failed (exit 1)" in err, err[-3000:]
    # The rank's own failures.log line, then its last lines.
    assert "Its error: IndexError: index out of range in self" in err, err[-3000:]
    assert "IndexError: index out of range" in err
    assert trained_steps(run_dir) == 2
    assert train_procs(run_dir) == []
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "failed" and result["error"] == "rank 1: exit 1", result


@pytest.mark.slow
def test_sigkill_of_a_rank_ends_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    p = launcher(f"launcher.run_dir={run_dir}", "train.steps=100000", "train.log_every_steps=1")
    wait_for(lambda: trained_steps(run_dir) >= 2, 240, "training to start")
    pids = rank_pids(run_dir, p.pid)
    assert sorted(pids) == [0, 1], pids
    os.kill(pids[1], signal.SIGKILL)
    killed_at = time.monotonic()
    out, err = p.communicate(timeout=60)
    assert time.monotonic() - killed_at < 30
    assert p.returncode == 128 + signal.SIGKILL, out[-2000:] + err[-2000:]
    assert "meshrun: rank 1 failed (killed by SIGKILL)" in err, err[-3000:]
    assert train_procs(run_dir) == []
    assert json.loads((run_dir / "result.json").read_text())["status"] == "failed"


@pytest.mark.slow
def test_killed_launcher_leaves_no_rank_and_a_run_dir_has_one_owner(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = launcher(f"launcher.run_dir={run_dir}", "train.steps=100000", "train.log_every_steps=1")
    wait_for(lambda: trained_steps(run_dir) >= 2, 240, "training to start")
    assert sorted(rank_pids(run_dir, first.pid)) == [0, 1]

    # A second start of the same run dir while the first runs: refused, and
    # it starts no rank.
    second = launcher(f"launcher.run_dir={run_dir}", "train.steps=100000")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 2, out + err
    assert f"meshrun: error: launcher.run_dir='{run_dir}' is in use: launcher pid {first.pid}" in err, err
    assert "Traceback" not in err
    assert sorted(rank_pids(run_dir, first.pid)) == [0, 1] and first.poll() is None

    first.send_signal(signal.SIGKILL)  # no handler, no clean-up: an OOM kill, a lost terminal
    first.communicate(timeout=30)
    time.sleep(10)
    assert train_procs(run_dir) == []
    # The dead owner left no stale lock.
    with own_run_dir(run_dir):
        assert f"pid {os.getpid()}" in (run_dir / "launcher.lock").read_text()
