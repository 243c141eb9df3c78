"""job=script with job.launch=torchrun: the program's global RANK 0 reports
its progress and result from whichever node torchrun's rendezvous put it on
(launcher/taskwrap/workers.py), and ``meshrun status logs`` finds its output
there. Two task wrappers of one 2-node run on this machine, each starting a
torchrun; the cluster test is tests/cluster/test_script_torchrun_cluster.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from harness import TOY, free_port, spec_of

from launcher.commands import status
from launcher.config.scriptjob import read_workers

ROOT = Path(__file__).resolve().parents[2]

# A program that prints its progress on global rank 0 only, as most do.
RANK0_PRINTS = textwrap.dedent(
    """
    import os, sys, time
    rank = int(os.environ["RANK"])
    time.sleep(0.5)  # a real program's start-up: its workers are seen before its first step
    for step in range(1, 4):
        if rank == 0:
            print(f"step {step} loss {1.0 / step:.3f}", flush=True)
        time.sleep(0.2)
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} done", flush=True)
    """
)

# torchrun as the wrapper calls it (python -m torch.distributed.run --opts SCRIPT ARGS),
# its rendezvous's node order given by FAKE_GROUP_RANK: each worker gets torchrun's variables.
FAKE_TORCHRUN = textwrap.dedent(
    """
    import os, subprocess, sys
    argv = sys.argv[1:]
    i = argv.index("torch.distributed.run") + 1
    opts = {}
    while argv[i].startswith("--"):
        k, _, v = argv[i][2:].partition("=")
        opts[k], i = v, i + 1
    nproc, nnodes = int(opts["nproc-per-node"]), int(opts["nnodes"])
    group = int(os.environ["FAKE_GROUP_RANK"])
    procs = []
    for local in range(nproc):
        env = dict(os.environ, RANK=str(group * nproc + local), LOCAL_RANK=str(local),
                   GROUP_RANK=str(group), WORLD_SIZE=str(nnodes * nproc), LOCAL_WORLD_SIZE=str(nproc),
                   TORCHELASTIC_RUN_ID=opts["rdzv-id"])
        procs.append(subprocess.Popen([sys.executable, *argv[i:]], env=env))
    sys.exit(max(p.wait() for p in procs))
    """
)


def _wrapper(run_dir: str, node: int, rendezvous_rank: int = -1, **extra: str) -> subprocess.Popen[str]:
    """Node ``node``'s task wrapper (Slurm's node order), whose torchrun the
    rendezvous numbered ``rendezvous_rank`` (the fake one's; a real one's is torchrun's)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GROUP_RANK": str(node),
        "FAKE_GROUP_RANK": str(rendezvous_rank),
    }
    for name in ("MESHRUN_LAUNCHER_PID", "MESHRUN_ATTEMPT", "RANK", "WORLD_SIZE", "SLURM_JOB_ID"):
        env.pop(name, None)
    env.update(extra)
    return subprocess.Popen(
        [sys.executable, "-m", "launcher.taskwrap", run_dir],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_global_rank_0_on_the_second_node_reports_the_programs_steps_and_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: the rendezvous put global ranks 0-1 on the second
    node. Before: its output in logs/rank2.log, result.json
    {"final_step": 0, "final_loss": null}, no step in metrics.jsonl. Now the
    second node's task reports the program's steps and result, and records
    which of its ranks are where."""
    prog, fake = tmp_path / "prog.py", tmp_path / "fake-python"
    prog.write_text(RANK0_PRINTS)
    fake.write_text(f"#!{sys.executable}\n{FAKE_TORCHRUN}")
    fake.chmod(0o755)
    spec = spec_of(
        tmp_path,
        "job.launch=torchrun",
        f"job.python={fake}",
        f"job.workdir={tmp_path}",
        "cluster=testcluster",
        "cluster.nodes=2",
        "cluster.gpus_per_node=2",
        script=str(prog),
    )
    run = Path(spec.run_dir)
    tasks = [_wrapper(spec.run_dir, 0, 1), _wrapper(spec.run_dir, 1, 0)]
    outs = [p.communicate(timeout=120)[0] for p in tasks]
    assert [p.returncode for p in tasks] == [0, 0], outs
    assert "the program's rank 0 reports from here" in outs[1] and "reports from here" not in outs[0]
    assert json.loads((run / "result.json").read_text()) == {
        "final_step": 3,
        "final_loss": 0.333,
        "status": "completed",
    }
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in recs if "step" in r] == [(1, 1.0), (2, 0.5), (3, 0.333)]
    # The program's start and exit stay the first task's (goodput's frame of the job).
    assert [r["event"] for r in recs if "event" in r] == ["program_start", "program_exit"]
    assert "step 3 loss 0.333" in (run / "logs" / "rank2.log").read_text()
    assert "step" not in (run / "logs" / "rank0.log").read_text()
    where = read_workers(run)
    assert {r: (w["log_rank"], w["task"]) for r, w in where.items()} == {
        0: (2, 1),
        1: (2, 1),
        2: (0, 0),
        3: (0, 0),
    }
    assert time.time() - where[0]["time"] < 120
    # meshrun logs: rank 0's output is the second node's log; every rank's, each node's log once.
    assert status.main(["logs", str(run), "-n", "3"]) == 0
    out = capsys.readouterr().out
    assert (
        f"rank 0 of 4 (node 1's torchrun: ranks 0-1) (--rank N, --rank all: the others): {run}/logs/rank2.log"
        in out
    )
    assert "step 3 loss 0.333" in out
    assert status.main(["logs", str(run), "--rank", "all"]) == 0
    out = capsys.readouterr().out
    assert out.index("ranks 0-1 of 4 (node 1's torchrun)") < out.index("ranks 2-3 of 4 (node 0's torchrun)")


def test_real_torchrun_rendezvous_putting_rank_0_on_the_second_node(tmp_path: Path) -> None:
    """Two real torchruns of one 2-node run on this machine (a c10d
    rendezvous on 127.0.0.1). c10d orders the nodes by host name, then by
    its agent's pid: the second node's torchrun, started first, gets global
    rank 0. Its wrapper reports the program's last step and rank 0's loss."""
    spec = spec_of(
        tmp_path,
        "job.launch=torchrun",
        "job.args=[--steps,6,--save-every,3,--rank0-prints]",
        f"job.workdir={TOY.parent}",
        "cluster=testcluster",
        "cluster.nodes=2",
        "cluster.gpus_per_node=1",
    )
    run = Path(spec.run_dir)
    port = str(free_port())
    second = _wrapper(spec.run_dir, 1, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    time.sleep(2.0)  # its torchrun started (the lower pid) and waits at the rendezvous
    first = _wrapper(spec.run_dir, 0, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    outs = [p.communicate(timeout=240)[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outs
    where = read_workers(run)
    assert {r: w["node"] for r, w in where.items()} == {0: 1, 1: 0}, (where, outs)
    printed = re.findall(r"step (\d+) loss ([\d.]+) world 2", (run / "logs" / "rank1.log").read_text())
    assert printed and "loss" not in (run / "logs" / "rank0.log").read_text()
    result = json.loads((run / "result.json").read_text())
    assert (result["final_step"], result["final_loss"], result["status"]) == (
        6,
        float(printed[-1][1]),
        "completed",
    )
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "step" in r] == [1, 2, 3, 4, 5, 6]
