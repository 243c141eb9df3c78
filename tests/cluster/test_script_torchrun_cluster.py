"""job=script with job.launch=torchrun on the real test cluster: 2 nodes,
one torchrun each (a c10d rendezvous on the first), and the program's
global rank 0 on the second node. result.json, metrics.jsonl, status and
``meshrun logs`` follow the program's rank 0 there (launcher/taskwrap/workers.py,
launcher/views/ranklogs.py); the same on this machine without Slurm:
tests/local/test_script_torchrun_rank0.py."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import time
from pathlib import Path

import pytest
from harness import job_id_from, launch_toy, wait_job
from runviews import assert_views_agree

from launcher.config.scriptjob import read_workers

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]
STEPS = 8

# job.python for torchrun: c10d orders the nodes by host name (one host on
# the test cluster), then by its agent's pid, so it is chance which node
# gets global rank 0. On Slurm's first node this starts torchrun 3 s late
# in a new process (a later pid): global rank 0 lands on the second node,
# the case the wrapper once lost (result.json {"final_step": 0}).
LATE_ON_NODE0 = textwrap.dedent(
    f"""\
    #!{sys.executable}
    import os, subprocess, sys, time
    python = {sys.executable!r}
    if os.environ.get("SLURM_NODEID") == "0":
        time.sleep(3)
        sys.exit(subprocess.run([python, *sys.argv[1:]]).returncode)
    os.execv(python, [python, *sys.argv[1:]])
    """
)


def test_torchruns_global_rank_0_on_the_second_node_reports_the_programs_steps_and_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from launcher.commands import status
    from launcher.views.runstate import table

    t0 = time.monotonic()
    shim = tmp_path / "python-late-on-node0"
    shim.write_text(LATE_ON_NODE0)
    shim.chmod(0o755)
    run_dir = tmp_path / "run"
    out = launch_toy(
        "job.launch=torchrun",
        f"job.python={shim}",
        f"job.args=[--steps,{STEPS},--save-every,4,--sleep,0.2,--rank0-prints]",
        "cluster=testcluster",
        "cluster.nodes=2",
        "cluster.gpus_per_node=2",
        "launcher.exclusive=false",
        "qos.time_limit_min=5",
        f"launcher.runs_root={tmp_path}",
        run_dir=run_dir,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    job = job_id_from(out.stdout)
    state = wait_job(job, 300)["state"]
    errs = [run_dir / "slurm" / f"{job}_{t}_log.err" for t in range(2)]
    err = "".join(e.read_text() for e in errs if e.exists())
    assert state == "COMPLETED", err[-3000:]
    # The rendezvous put ranks 0-1 on the second node (Slurm task 1, the wrapper's logs/rank2.log).
    where = read_workers(run_dir)
    assert {r: (w["task"], w["log_rank"]) for r, w in where.items()} == {
        0: (1, 2),
        1: (1, 2),
        2: (0, 0),
        3: (0, 0),
    }, err[-3000:]
    node1 = (run_dir / "slurm" / f"{job}_1_log.out").read_text()
    printed = re.findall(r"step (\d+) loss ([\d.]+) world 4", node1)
    assert [int(s) for s, _ in printed] == list(range(1, STEPS + 1)), node1[-2000:]
    assert "loss" not in (run_dir / "slurm" / f"{job}_0_log.out").read_text()
    # result.json and metrics.jsonl are the program's rank 0's.
    result = json.loads((run_dir / "result.json").read_text())
    loss = float(printed[-1][1])
    assert (result["final_step"], result["final_loss"], result["status"]) == (STEPS, loss, "completed"), (
        result
    )
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"step"' in x]
    assert [(r["step"], r["loss"]) for r in steps] == [(int(s), float(v)) for s, v in printed]
    row = table(run_dir)[0]
    assert (row.state, row.step, row.loss) == ("COMPLETED", str(STEPS), f"{loss:.4f}"), row
    # meshrun logs: rank 0's output is the second node's task file.
    assert status.main(["logs", str(run_dir), "-n", "50"]) == 0
    shown = capsys.readouterr().out
    assert "rank 0 of 4 (node 1's torchrun: ranks 0-1)" in shown and f"{job}_1_log.out" in shown, shown
    assert f"step {STEPS} loss {printed[-1][1]} world 4" in shown
    # Status, fleet, the page, the API and goodput.json: one record of it.
    g = assert_views_agree(run_dir, tmp_path, [job], state="COMPLETED", step=STEPS)["goodput"]
    assert (g["restarts"], g["failures"]) == (0, 0), g
    print(f"torchrun cluster test: {time.monotonic() - t0:.0f} s wall")
