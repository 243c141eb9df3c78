"""In-process recovery (launcher.in_process_recovery) through the real
launcher and trainer: 4 gloo ranks (partners half the ranks over, the pairing
of 2 nodes x 2), rank 2 SIGKILLed mid-run. The launcher starts a replacement
for rank 2 only; the survivors keep their processes, the replacement gets
rank 2's state from its partner's host memory, every rank rolls back to the
same step and the run completes with the losses of an uninterrupted run
(bitwise: CPU, same seeds). The fault is in faults.jsonl with its seconds.

Runtime: the two runs go side by side (about 30 s on 2 busy cores)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import TINY_MODEL

REPO = Path(__file__).resolve().parents[2]
STEPS, KILL_AT, VICTIM = 24, 8, 2
OVERRIDES = (
    *TINY_MODEL,
    "train.global_batch_size=4",
    "train.warmup_steps=3",
    "train.log_every_steps=1",
    f"train.steps={STEPS}",
    "parallelism=fsdp",
    "parallelism.precision=fp32",
    "cluster.local_processes=4",
    "cluster.metrics_port=0",
    "storage.save_every_steps=1000",
    "launcher.in_process_recovery=true",
    # A collective queued before the fault's abort fails after this long.
    "launcher.in_process_collective_timeout_s=5",
)


def start(run_dir: Path) -> subprocess.Popen:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MESHRUN_"))
    }
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TMPDIR=str(run_dir.parent))
    out = open(f"{run_dir}.out", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "launcher", f"launcher.run_dir={run_dir}", f"hydra.run.dir={run_dir}/hydra",
         *OVERRIDES],
        env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
    )  # fmt: skip


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """rank -> pid of the launcher's rank processes (their RANK variable)."""
    out = {}
    for task in Path(f"/proc/{launcher_pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for pid in (task / "children").read_text().split():
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                ranks = [x[5:] for x in env if x.startswith(b"RANK=")]
                if ranks and b"train" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    out[int(ranks[0])] = int(pid)
    return out


def logged_step(run_dir: Path) -> int:
    m = run_dir / "metrics.jsonl"
    lines = m.read_text().splitlines() if m.exists() else []
    return max((json.loads(x).get("step", 0) for x in lines if x.endswith("}")), default=0)


def losses(run_dir: Path) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("event") is None and "loss" in r:
            out.setdefault(r["step"], []).append(r["loss"])
    return out


def test_a_killed_rank_is_replaced_in_process(tmp_path: Path) -> None:
    ref_dir, run_dir = tmp_path / "uninterrupted", tmp_path / "killed"
    ref, run = start(ref_dir), start(run_dir)
    try:
        deadline = time.monotonic() + 120
        while logged_step(run_dir) < KILL_AT:
            assert run.poll() is None and time.monotonic() < deadline, Path(f"{run_dir}.out").read_text()[
                -3000:
            ]
            time.sleep(0.05)
        before = rank_pids(run.pid)
        assert sorted(before) == [0, 1, 2, 3], before
        os.kill(before[VICTIM], signal.SIGKILL)
        assert run.wait(timeout=120) == 0, Path(f"{run_dir}.out").read_text()[-3000:]
        assert ref.wait(timeout=120) == 0, Path(f"{ref_dir}.out").read_text()[-3000:]
    finally:
        for p in (ref, run):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    out = Path(f"{run_dir}.out").read_text()
    assert f"rank {VICTIM} died (killed by SIGKILL); starting a replacement" in out
    # The survivors recovered in their own processes; the replacement is new.
    said = {}
    for r in range(4):
        m = re.search(r"rank (\d) \(pid (\d+), (survivor|replacement)\): in-process recovery at generation 1: "
                      r"rolled back to step (\d+) from peer memory", (run_dir / "logs" / f"rank{r}.log").read_text())  # fmt: skip
        assert m, (run_dir / "logs" / f"rank{r}.log").read_text()[-2000:]
        said[r] = (int(m[2]), m[3], int(m[4]))
    for r in (0, 1, 3):
        assert said[r][:2] == (before[r], "survivor"), (r, said[r], before)
    assert said[VICTIM][1] == "replacement" and said[VICTIM][0] != before[VICTIM]
    assert len({s[2] for s in said.values()}) == 1  # every rank rolled back to the same step
    # The fault's record: rank 2 lost, state from peer memory, at most 1 step redone.
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    assert len(faults) == 1, faults
    f = faults[0]
    assert (f["cause"], f["action"], f["ranks"], f["state_from"]) == (
        "rank_lost",
        "in_process",
        [VICTIM],
        "peer memory",
    )
    assert f["steps_redone"] <= 1 and f["rolled_back_to"] >= KILL_AT - 1, f
    assert 0 < f["recovery_s"] < 60, f
    print(f"recovery: {f['recovery_s']:.2f} s from the fault to step {f['first_step']} done, "
          f"{f['steps_redone']} step(s) redone, rolled back to step {f['rolled_back_to']}")  # fmt: skip
    # The loss curve: every step, the last time it ran, equals the uninterrupted run's, bitwise.
    a, b = losses(ref_dir), losses(run_dir)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    assert {s: v[-1] for s, v in b.items()} == {s: v[0] for s, v in a.items()}
    assert json.loads((run_dir / "result.json").read_text())["status"] == "completed"
