"""What the third-party program tests on the test cluster share
(tests/cluster/test_thirdparty_*_cluster.py): a program's own venv from the package
index, finding a rank's program, the faults they inject (a preemption by a
training-QOS job) and what every such run must show afterwards (its faults,
goodput and fleet row)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from harness import beat_where, wait_job


def _lowest_priority() -> None:
    """nice 19, and so its autogroup where the kernel groups by session (a
    new session's group would otherwise weigh as much as the tests')."""
    os.nice(19)
    with contextlib.suppress(OSError):
        Path("/proc/self/autogroup").write_text("19")


def _normal_priority(pid: int) -> None:
    """The process group of ``pid`` back at nice 0 (it needs root: CI's case;
    else it finishes as it is)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PGRP, pid, 0)
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text("0")


class VenvBuild:
    """A virtualenv of its own (not meshrun's) with ``pins`` from the package
    index, built in ``root`` by a background process (its own session) at the
    lowest CPU priority (``ahead``) from the moment this is made, so a build
    started ahead takes only CPU the tests before it leave idle; its log
    beside ``root``."""

    def __init__(self, root: Path, pins: list[str], ahead: bool = True) -> None:
        self.root, self.log = root, root.with_name(root.name + ".log")
        script = '"$0" -m venv "$1" && "$1/bin/python" -m pip install -q --disable-pip-version-check "${@:2}"'
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                ["bash", "-c", script, sys.executable, str(root), *pins],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_lowest_priority if ahead else None,
            )  # fmt: skip

    def python(self, timeout: float = 900) -> Path:
        """Its python, once built (the build back at normal priority while waited for)."""
        if self.proc.poll() is None:
            _normal_priority(self.proc.pid)
        assert self.proc.wait(timeout) == 0, self.log.read_text()[-3000:]
        return self.root / "bin" / "python"

    def stop(self) -> None:
        """End a build no test waited for (the session ended first)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


class VenvsAhead:
    """The session's third-party virtualenvs by name: ``wanted`` (name ->
    pins) started ahead (tests/conftest.py: ``venvs_start``) or, when not,
    when first asked for."""

    def __init__(self, factory: pytest.TempPathFactory, wanted: dict[str, list[str]]) -> None:
        self.factory, self.wanted, self.builds = factory, wanted, {}

    def start_wanted(self) -> None:
        for name, pins in self.wanted.items():
            self.start(name, pins)

    def start(self, name: str, pins: list[str]) -> None:
        if name not in self.builds:
            self.builds[name] = VenvBuild(self.factory.mktemp(f"venv-{name}"), pins)

    def python(self, name: str, pins: list[str]) -> Path:
        self.start(name, pins)
        return self.builds[name].python()

    def stop(self) -> None:
        for build in self.builds.values():
            build.stop()


def make_venv(factory: pytest.TempPathFactory, name: str, pins: list[str]) -> Path:
    """A virtualenv of its own (not meshrun's) with ``pins`` from the package index, built now; its python."""
    return VenvBuild(factory.mktemp(f"venv-{name}"), pins, ahead=False).python()


def program_of(wrapper_pid: int) -> int:
    """The program (the wrapper's child), not the wrapper."""
    child = subprocess.run(["pgrep", "-P", str(wrapper_pid)], capture_output=True, text=True).stdout.split()
    assert len(child) == 1, child
    return int(child[0])


def started_since(run_dir: Path, rank: int, since: float, step: int, timeout: float) -> dict:
    """The rank's heartbeat from a process whose first step came after
    ``since``, once it reached ``step``."""
    return beat_where(
        run_dir, rank,
        lambda h: h.get("first_step_at", 0) > since and h["phase"] == "step" and h["step"] >= step,
        timeout, f"rank {rank}: no new process at step {step} in {timeout} s",
    )  # fmt: skip


def resumed_since(run_dir: Path, rank: int, since: float, timeout: float = 300) -> dict:
    """The rank's heartbeat from a process that started after ``since``, 3 steps past its first."""
    return beat_where(
        run_dir, rank,
        lambda h: h.get("first_step_at", 0) > since and h["phase"] == "step"
        and h["step"] >= h.get("first_step", 0) + 3,
        timeout, f"rank {rank}: no process started after {since:.0f} and 3 steps on in {timeout} s",
    )  # fmt: skip


def rank_beat(run_dir: Path, rank: int, attempt: str, timeout: float = 60) -> dict:
    """The rank's heartbeat in ``attempt`` (it may report no step: its wrapper's pid and node)."""
    return beat_where(
        run_dir, rank, lambda h: h.get("attempt") == attempt, timeout,
        f"rank {rank}: no heartbeat in attempt {attempt} in {timeout} s",
    )  # fmt: skip


def preempt(node: str) -> float:
    """Preempt whatever runs on ``node`` with a training-QOS job (the test
    cluster's QOS preempt research's with REQUEUE: Slurm sends SIGTERM); when."""
    at = time.time()
    subprocess.run(
        ["sbatch", "--parsable", "-N1", "-w", node, "-p", "training", "-q", "training", "-A", "training",
         "-t", "1", "--mem=200G", "-o", "/dev/null", "--wrap", "sleep 2"],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return at


def preempt_hang_and_finish(
    run_dir: Path, job: str, node: str, steps: int, timeout: float
) -> tuple[float, dict, dict]:
    """Preempt the job on ``node``; once the next allocation's rank 0 has
    resumed, SIGSTOP rank 3's program (rank 0's bar then stops in its next
    collective); the job must complete at ``steps``. (When preempted, the
    resumed rank 0's heartbeat, the stopped rank's.)"""
    preempted_at = preempt(node)
    resumed = resumed_since(run_dir, 0, preempted_at)  # the next allocation's rank 0, 3 steps past its first
    stopped = rank_beat(run_dir, 3, resumed["attempt"])
    os.kill(program_of(stopped["pid"]), signal.SIGSTOP)
    rec = wait_job(job, timeout)
    err = (run_dir / "slurm" / f"{job}_0_log.err").read_text()
    assert rec["state"] == "COMPLETED", err[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["final_step"] == steps, result
    return preempted_at, resumed, stopped


def kill_and_hang_faults(run_dir: Path, job: str, killed: dict, stopped: dict) -> tuple[dict, dict, list]:
    """(the kill's fault, the hang's, the resumed events): the SIGKILLed
    task's node blamed (or the node Slurm saw stop responding), the
    SIGSTOPped rank found unresponsive, both restarted in the allocation."""
    fs = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    kill = next(f for f in fs if "event" not in f)
    assert kill["action"] == "restart" and kill["srun_exit"] == 128 + signal.SIGKILL, fs
    assert kill["cause"] == "signal" and kill["node"] == killed["node"] or kill["cause"] == "node_down", fs
    # (A quiet rank that outlives rank 0's completed program, stuck in its
    # teardown, ends the run: action "end: completed", not a restart.)
    hang = [f for f in fs if f.get("cause") == "hang" and "event" not in f and f["action"] == "restart"]
    assert len(hang) == 1 and hang[0]["node"] == stopped["node"], fs
    assert stopped["rank"] in hang[0]["evidence"]["unresponsive_ranks"], hang
    # The ranks that answered, blocked in a collective, gave their Python
    # stacks (their faulthandler: meshrun's stack hook).
    texts = [Path(p).read_text() for p in hang[0]["evidence"]["stacks"].values()]
    assert texts and all("most recent call first" in t for t in texts), texts
    resumed = [f for f in fs if f.get("event") == "resumed"]
    assert [r["cause"] for r in resumed] == [kill["cause"], "hang"] and all(
        r["job"] == job for r in resumed
    ), fs
    return kill, hang[0], resumed


def goodput_and_fleet(run_dir: Path, root: Path, job: str) -> dict:
    """goodput.json once final (its buckets cover the allocation, redone
    work counted) and the run's row in ``meshrun fleet``; goodput.json."""
    good = json.loads((run_dir / "goodput.json").read_text())
    assert good["final"] and good["buckets_s"]["redone"] > 0 and 0 < good["ettr"] < 1, good
    buckets_cover_allocation(good)
    fleet_lists_script(root, job)
    return good


def buckets_cover_allocation(good: dict) -> None:
    """goodput.json's buckets sum to its allocated GPU-seconds (within 2%)."""
    assert (
        abs(sum(good["buckets_gpu_s"].values()) - good["allocated_gpu_s"]) <= 0.02 * good["allocated_gpu_s"]
    ), good


def fleet_lists_script(root: Path, job: str) -> None:
    """``meshrun fleet`` over ``root`` lists the job as a completed run of its
    program (the script's file or ``-m`` module, never the trainer's model)."""
    fleet = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "fleet", str(root), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert fleet.returncode == 0, fleet.stderr
    (row,) = [r for r in json.loads(fleet.stdout)["runs"] if r.get("job_id") == job]
    cfg = yaml.safe_load((Path(row["run_dir"]) / "config.yaml").read_text())["job"]
    name = Path(cfg["script"]).name if cfg["script"] else f"-m {cfg['module']}"
    assert row["program"].startswith(name) and row["state"] == "COMPLETED", (name, row)
    assert row.get("model") in (None, "", "-"), row  # a script run has no meshrun model


def step_drops(run_dir: Path) -> list[tuple[int, int]]:
    """(from, to) of each time metrics.jsonl's steps went back: the work redone."""
    steps = [
        json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"step"' in x
    ]
    return [(steps[i - 1], steps[i]) for i in range(1, len(steps)) if steps[i] <= steps[i - 1]]
