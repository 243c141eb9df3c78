"""In-process recovery (launcher.in_process_recovery) through the real
launcher and trainer: 4 gloo ranks (partners half the ranks over, the pairing
of 2 nodes x 2), rank 2 SIGKILLed mid-run (in CI; the campaign cases: then
its replacement SIGKILLed, or SIGSTOPped, once that recovery is done; and
rank 2 SIGSTOPped: a hang), also at dp 2 x tp 2 (CI) and pp 2 x dp 2
(the campaign). Each time the launcher replaces rank 2 only (the
first time with its warm spare, a process that loaded torch and the trainer
before the fault; a hung one it kills first); the survivors keep their
processes, the replacement gets rank
2's state from its partner's host memory, every rank rolls back to the same
step and the run completes with the losses of an uninterrupted run
(bitwise: CPU, same seeds). Each fault is in faults.jsonl with its seconds,
goodput.json charges the recoveries to their own bucket, ``meshrun status``
says them.

Runtime: the two runs go side by side (35-90 s on 2 busy cores)."""

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

import pytest
from harness import TINY_MODEL, start_local_run

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


# Beyond data parallel: tensor parallel (dp 2 x tp 2: rank 2 is dp 1, tp 0)
# and pipeline parallel (pp 2 x dp 2, interleaved 1F1B, 2 stages a rank);
# each rank's state is its own shards, restored at the same rank.
TP = ("parallelism=fsdp_tp", "parallelism.tp=2", "model.n_kv_heads=2", "parallelism.precision=fp32")
PP = ("parallelism=fsdp_tp_pp", "parallelism.tp=1", "parallelism.pp=2", "model.n_layers=4",
      "parallelism.precision=fp32")  # fmt: skip


def start(run_dir: Path, layout: tuple[str, ...] = ()) -> subprocess.Popen:
    overrides = [o for o in OVERRIDES if not (layout and o.startswith("parallelism="))]
    return start_local_run(run_dir, *overrides, *layout, cwd=REPO)


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


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def logged_step(run_dir: Path) -> int:
    m = run_dir / "metrics.jsonl"
    lines = m.read_text().splitlines() if m.exists() else []
    return max((json.loads(x).get("step", 0) for x in lines if x.endswith("}")), default=0)


def ended(p: subprocess.Popen, run_dir: Path, timeout_s: float = 120) -> int:
    """The run's exit code; a run still going after ``timeout_s``: a failure
    that says where it stands (its output, faults, every rank's log tail)."""
    try:
        return p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        logs = {f.name: read(f)[-600:] for f in sorted((run_dir / "logs").glob("*.log"))}
        raise AssertionError(
            (f"the run did not end in {timeout_s} s", read(Path(f"{run_dir}.out"))[-2000:],
             read(run_dir / "faults.jsonl"), logs)
        ) from None  # fmt: skip


def losses(run_dir: Path) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("event") is None and "loss" in r:
            out.setdefault(r["step"], []).append(r["loss"])
    return out


# One SIGKILL runs in CI (the warm spare takes the rank). It was a campaign
# once: in the full suite its first recovery hung in its rejoin (no step for
# 100 s); a survivor's peer-copy receive, posted after its partner died,
# waited the group's creation timeout (600 s), now bounded. It hung once
# more in CI (and 2 of 8 runs here): the launcher's late word of the death
# broke the generation the warm spare was forming (train/inprocess/missing.py
# flag_dead now checks the dead process's incarnation). The campaigns
# (pytest -m campaign): the replacement SIGKILLed too once the first
# recovery is recorded; rank 2 hung (SIGSTOP); the replacement hung.
# The tensor-parallel case runs in CI too, the pipeline one in the campaign.
@pytest.mark.parametrize(
    ("sigs", "layout"),
    [
        pytest.param((signal.SIGKILL,), (), id="SIGKILL"),
        pytest.param((signal.SIGKILL, signal.SIGKILL), (), marks=pytest.mark.campaign, id="SIGKILL-SIGKILL"),
        pytest.param((signal.SIGSTOP,), (), marks=pytest.mark.campaign, id="SIGSTOP"),
        pytest.param((signal.SIGKILL, signal.SIGSTOP), (), marks=pytest.mark.campaign, id="SIGKILL-SIGSTOP"),
        pytest.param((signal.SIGKILL,), TP, id="SIGKILL-tp2"),
        pytest.param((signal.SIGKILL,), PP, marks=pytest.mark.campaign, id="SIGKILL-pp2"),
    ],
)
def test_a_killed_rank_is_replaced_in_process(
    tmp_path: Path, sigs: tuple[signal.Signals, ...], layout: tuple[str, ...]
) -> None:
    kills, sig = len(sigs), sigs[0]
    ref_dir, run_dir = tmp_path / "uninterrupted", tmp_path / "killed"
    ref, run = start(ref_dir, layout), start(run_dir, layout)
    try:
        deadline = time.monotonic() + 120
        while logged_step(run_dir) < KILL_AT:
            assert run.poll() is None and time.monotonic() < deadline, Path(f"{run_dir}.out").read_text()[
                -3000:
            ]
            time.sleep(0.05)
        before = rank_pids(run.pid)
        assert sorted(before) == [0, 1, 2, 3], before
        os.kill(before[VICTIM], sig)  # SIGSTOP: a hang, found by the store host, killed by the launcher
        second = before
        if kills == 2:  # the replacement itself, once the first recovery is recorded
            while '"event": "resumed"' not in read(run_dir / "faults.jsonl"):
                assert run.poll() is None and time.monotonic() < deadline, read(Path(f"{run_dir}.out"))[
                    -3000:
                ]
                time.sleep(0.05)
            # The replacement is the warm spare: its RANK is set in-process, so its pid is the one it said.
            logs = read(run_dir / "logs" / "spare.log") + read(run_dir / "logs" / f"rank{VICTIM}.log")
            took = re.search(
                rf"warm spare \(pid (\d+)\) takes rank {VICTIM}", logs
            )  # its line lands in either
            assert took, logs
            second = {**before, VICTIM: int(took[1])}
            assert second[VICTIM] != before[VICTIM] and logged_step(run_dir) < STEPS, (second, before)
            os.kill(second[VICTIM], sigs[1])  # SIGSTOP: the local launcher kills a hung replacement too
        assert ended(run, run_dir) == 0, Path(f"{run_dir}.out").read_text()[-3000:]
        assert ended(ref, ref_dir) == 0, Path(f"{ref_dir}.out").read_text()[-3000:]
    finally:
        for p in (ref, run):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    out = Path(f"{run_dir}.out").read_text()
    hung = f"rank {VICTIM} neither left the broken generation nor joined the next after the fault: hung"
    assert out.count(hung) == out.count("neither left") == sigs.count(signal.SIGSTOP), out[-3000:]
    assert out.count(f"rank {VICTIM} died (killed by SIGKILL); starting a replacement") == kills, out[-3000:]
    # The survivors recovered in their own processes, each time; each replacement is new.
    pids = {1: before, 2: second}
    for gen in range(1, kills + 1):
        said = {}
        for r in range(4):
            log = (run_dir / "logs" / f"rank{r}.log").read_text()
            m = re.search(rf"rank (\d) \(pid (\d+), (survivor|replacement)\): in-process recovery at generation "
                          rf"{gen}: rolled back to step (\d+) from peer memory", log)  # fmt: skip
            assert m, (gen, log[-2000:])
            said[r] = (int(m[2]), m[3], int(m[4]))
        for r in (0, 1, 3):
            assert said[r][:2] == (before[r], "survivor"), (gen, r, said[r], before)
        assert said[VICTIM][1] == "replacement" and said[VICTIM][0] not in (before[VICTIM], pids[gen][VICTIM])
        assert len({s[2] for s in said.values()}) == 1  # every rank rolled back to the same step
        if gen == 1:  # the first replacement is the warm spare (launcher.warm_spare), loaded before the fault
            spare = re.search(r"warm spare on \S+ \(pid (\d+)\)", read(run_dir / "logs" / "spare.log"))
            assert spare and said[VICTIM][0] == int(spare[1]), (said, read(run_dir / "logs" / "spare.log"))
    # Each fault's record, as a restart's: the fault (rank 2 lost, state from
    # peer memory, at most 1 step redone), then how the run came back.
    recs = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    faults = [r for r in recs if "event" not in r]
    resumed = [r for r in recs if r.get("event") == "resumed"]
    assert len(faults) == len(resumed) == kills, recs
    for f, back, s in zip(faults, resumed, sigs, strict=True):
        assert (f["cause"], f["action"], f["ranks"], f["state_from"]) == (
            "rank_hung" if s == signal.SIGSTOP else "rank_lost",
            "in_process",
            [VICTIM],
            "peer memory",
        )
        assert f["steps_redone"] <= 1 and f["rolled_back_to"] >= KILL_AT - 1, f
        assert 0 < f["recovery_s"] < 60, f
        assert (back["recovery"], back["seconds_lost"], back["steps_redone"], back["first_step"]) == (
            "in_process", round(f["recovery_s"], 2), f["steps_redone"], f["first_step"]
        )  # fmt: skip
        print(f"recovery at generation {f['generation']}: {f['recovery_s']:.2f} s from the fault to step "
              f"{f['first_step']} done, {f['steps_redone']} step(s) redone, rolled back to step "
              f"{f['rolled_back_to']}")  # fmt: skip
    if kills == 2:
        assert faults[1]["generation"] == 2 and faults[1]["rolled_back_to"] >= faults[0]["first_step"] - 1
    # goodput.json (the launcher's, at the run's end): the recoveries' own
    # bucket; every bucket still sums to the allocation (GPU-seconds: 0 on CPU).
    g = json.loads((run_dir / "goodput.json").read_text())
    b = g["buckets_s"]
    assert b["recovery"] > 0 and sum(b.values()) == pytest.approx(g["allocated_s"]), g
    assert sum(g["buckets_gpu_s"].values()) == pytest.approx(g["allocated_gpu_s"]), g
    assert (g["in_process_recoveries"], g["restarts"], g["failures"]) == (kills, 0, kills), g
    assert g["steps"]["redone"] == sum(f["steps_redone"] for f in faults), (g["steps"], faults)
    print(f"goodput: recovery {b['recovery']:.2f} s of {g['allocated_s']:.1f} s allocated")
    # meshrun status says them: kind, seconds, steps redone.
    st = subprocess.run([sys.executable, "-m", "launcher.status", str(run_dir)], capture_output=True,
                        text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)  # fmt: skip
    assert st.returncode == 0 and f"restarts 0, in-process recoveries {kills}" in st.stdout, (
        st.stdout + st.stderr
    )
    back = resumed[-1]
    assert (
        f"recovered in process from peer memory: {back['seconds_lost']:.1f} s to step {back['first_step']}, "
        f"{back['steps_redone']} step(s) redone" in st.stdout
    ), st.stdout
    # The loss curve: every step, the last time it ran, equals the uninterrupted run's, bitwise.
    a, b = losses(ref_dir), losses(run_dir)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    assert {s: v[-1] for s, v in b.items()} == {s: v[0] for s, v in a.items()}
    assert json.loads((run_dir / "result.json").read_text())["status"] == "completed"
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["dp"], plan["tp"], plan["pp"]) == {(): (4, 1, 1), TP: (2, 2, 1), PP: (2, 1, 2)}[layout], plan
