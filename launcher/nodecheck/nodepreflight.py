"""Preflight: check a node against its cluster preset before training burns
GPU-hours, and stop the job naming the node when something is wrong.

Checks (each pass / warn / fail / skip with a reason): GPU count and model
(NVML), NVLink between every GPU pair (``nvidia-smi topo -m``), InfiniBand
adapters active at the expected rate (``ibstat``, ``ibdev2netdev -v``),
scratch free space >= 2x the dataset plus checkpoints, RAM, S3 reachable with
the credentials present (:mod:`launcher.nodecheck.hostcheck`). The all-reduce bus-bandwidth test needs torch and
all ranks, so it lives in :mod:`train.observe.preflight_comm`.

Usage (the command: launcher/commands/preflight.py):
- ``python -m launcher.preflight [overrides...]``: this machine against a
  composed config (plus the all-reduce test over this node's ranks);
- ``python -m launcher.preflight --node RUN_DIR``: the first step of a job,
  once per node (``srun --ntasks-per-node=1``); writes
  ``RUN_DIR/preflight/<node>.json`` and exits 1 on a failure;
- ``python -m launcher.preflight --record RUN_DIR``: on the batch host, after
  a ``--node`` step failed: each failing node is a fault like any other (a
  ``faults.jsonl`` line, cause ``preflight``, the failed checks as evidence;
  a line of the runs root's bad-node ledger); when the allocation's other
  nodes are enough (``cluster.spare_nodes``), prints the srun flags that
  keep the rest of the job off them and exits 0 (the supervisor starts
  training without them), else exits 1 (the job ends);
- ``python -m launcher.preflight --report RUN_DIR``: every node's table.

Importing this module does not import torch (launcher rule).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.runfiles import ALLREDUCE_FILE
from launcher.config.secrets import without_secrets
from launcher.nodecheck.hostcheck import FAIL, Check, node_checks

RESULTS_DIR = "preflight"


@dataclass
class NodeReport:
    node: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "checks": [asdict(c) for c in self.checks]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeReport:
        return cls(d["node"], [Check(**c) for c in d["checks"]])


# --- output ------------------------------------------------------------------


def format_table(reports: list[NodeReport]) -> str:
    rows = [("node", "check", "status", "detail")]
    for r in reports:
        rows += [(r.node, c.name, c.status.upper(), c.detail) for c in r.checks]
    w = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(f"{a:<{w[0]}}  {b:<{w[1]}}  {s:<{w[2]}}  {d}" for a, b, s, d in rows)


def failure_message(reports: list[NodeReport], verdict: bool = True) -> str:
    """What failed where; with ``verdict``, that training did not start and
    how to resubmit (a job's ``--node`` step leaves that to ``--record``:
    a spare may take the node's place)."""
    bad = [r for r in reports if r.failed]
    nodes = ",".join(r.node for r in bad)
    what = "; ".join(f"{r.node}: " + ", ".join(f"{c.name} ({c.detail})" for c in r.failed) for r in bad)
    if not verdict:
        return f"meshrun: preflight FAILED on node(s) {nodes}: {what}."
    return (
        f"meshrun: preflight FAILED on node(s) {nodes}: {what}. Training was not started. "
        f"Resubmit without them: sbatch --exclude={nodes} (or fix the node / relax the preset)."
    )


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def run_node(run_dir: str, out_dir: str | None = None) -> int:
    """One node's preflight for a planned run (the job's first step; a
    burn-in's first half, into ``out_dir``: launcher/selfheal/growback.py)."""
    from launcher.config.spec import load_spec

    spec = load_spec(run_dir)
    report = NodeReport(
        node_name(),
        node_checks(
            spec.cfg, device=spec.plan.device, params=spec.plan.params, checkpoint_dir=spec.checkpoint_dir
        ),
    )
    out = Path(out_dir) if out_dir else Path(run_dir) / RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{report.node}.tmp"
    # Which start of which job this is: --record reads this start's reports only.
    start = {
        "job": os.environ.get("SLURM_JOB_ID", ""),
        "restart": os.environ.get("SLURM_RESTART_COUNT", "0") or "0",
    }
    tmp.write_text(json.dumps({**report.to_dict(), **start}, indent=1) + "\n")
    os.replace(tmp, out / f"{report.node}.json")
    print(format_table([report]), flush=True)
    if report.failed:
        print(failure_message([report], verdict=False), file=sys.stderr, flush=True)
        return 1
    return 0


def record_failures(run_dir: str, alloc: list[str], job: str, restart: str) -> tuple[int, str]:
    """(exit code, srun flags) after a failed ``--node`` step: see the module
    docstring. ``alloc``: the allocation's nodes, in Slurm's order."""
    from launcher.config import nodeledger, nodename
    from launcher.config.health import append_fault
    from launcher.config.spec import load_spec
    from launcher.slurm.nodestate import node_info

    spec = load_spec(run_dir)
    mine = {}
    for p in sorted((Path(run_dir) / RESULTS_DIR).glob("*.json")):
        d = json.loads(p.read_text()) if p.name != ALLREDUCE_FILE else {}
        if d.get("job") == job and d.get("restart") == restart:
            if (why := nodename.problem(d.get("node"))) is not None:  # it would reach srun's flags
                print(f"meshrun: warning: {p}: skipped: {why}", file=sys.stderr)
                continue
            mine[d["node"]] = (NodeReport.from_dict(d), p.stat().st_mtime)
    missing = [n for n in alloc if n not in mine]
    if missing:
        print(
            f"meshrun: no preflight result from node(s) {','.join(missing)}: nothing recorded",
            file=sys.stderr,
        )
        return 1, ""
    bad = [mine[n][0] for n in alloc if mine[n][0].failed]
    healthy = [n for n in alloc if not mine[n][0].failed]
    enough = len(healthy) >= spec.plan.nodes
    for r in bad:
        fault = {
            "job": job,
            "attempt": f"{restart}.preflight",
            "nodes": alloc,
            "cause": "preflight",
            "node": r.node,
            "error": "preflight: " + ", ".join(f"{c.name} ({c.detail})" for c in r.failed),
            "evidence": {"failed": [asdict(c) for c in r.failed]},
            "fault_at": mine[r.node][1],
            "detected_at": time.time(),
            "action": "exclude" if enough else "stop: too few nodes",
            "time": time.time(),
        }
        append_fault(run_dir, fault)
        rec = {
            "node": r.node,
            "cause": "preflight",
            "run": spec.run_id or run_dir,
            "run_dir": run_dir,
            "job": job,
            "detail": fault["error"][:200],
        }
        nodeledger.append_or_say(
            nodeledger.ledger_path(spec.cfg), rec, lambda msg: print(f"meshrun: {msg}", file=sys.stderr)
        )
    names = ",".join(r.node for r in bad)
    if not enough:
        print(
            f"{failure_message(bad)} {len(healthy)} healthy node(s) left of {spec.plan.nodes} needed.",
            file=sys.stderr,
        )
        return 1, ""
    rpn = spec.plan.ranks_per_node
    head = node_info(healthy[0]).get("NodeAddr") or healthy[0]
    print(
        f"meshrun: preflight failed on node(s) {names}: recorded; training starts without them",
        file=sys.stderr,
    )
    flags = [
        f"--exclude={names}",
        f"--nodes={len(healthy)}",
        f"--ntasks={len(healthy) * rpn}",
        f"--ntasks-per-node={rpn}",
        f"--export=ALL,MASTER_ADDR={head}",
    ]
    return 0, " ".join(flags)


def run_record(run_dir: str) -> int:
    from launcher.slurm.nodestate import hostnames

    alloc = hostnames(os.environ.get("SLURM_JOB_NODELIST", ""))
    job, restart = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
    rc, flags = record_failures(run_dir, alloc, job, restart)
    print(flags)
    return rc


def load_reports(run_dir: str) -> list[NodeReport]:
    return [
        NodeReport.from_dict(json.loads(p.read_text()))
        for p in sorted((Path(run_dir) / RESULTS_DIR).glob("*.json"))
        if p.name != ALLREDUCE_FILE
    ]


def run_report(run_dir: str) -> int:
    reports = load_reports(run_dir)
    comm = Path(run_dir) / RESULTS_DIR / ALLREDUCE_FILE
    if comm.exists():
        d = json.loads(comm.read_text())
        reports.append(NodeReport(d["nodes"], [Check(**d["check"])]))
    if not reports:
        print(f"meshrun: no preflight results under {run_dir}/{RESULTS_DIR}", file=sys.stderr)
        return 2
    print(format_table(reports))
    if any(r.failed for r in reports):
        print(failure_message(reports), file=sys.stderr)
        return 1
    return 0


def run_here(overrides: list[str], comm: bool = True) -> int:
    """This machine against a composed config, plus the all-reduce test over
    this node's ranks."""
    import tempfile

    from launcher.config import ncclenv as nccl
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec, save_spec
    from launcher.plan.make import make_plan
    from launcher.run.local import use_local_gpus

    cfg = compose(overrides)
    use_local_gpus(cfg.cluster)
    nccl.apply(cfg.cluster)
    plan = make_plan(cfg)
    with tempfile.TemporaryDirectory(prefix="meshrun-preflight-") as tmp:
        spec = RunSpec(cfg, plan, tmp)
        report = NodeReport(
            node_name(),
            node_checks(cfg, device=plan.device, params=plan.params, checkpoint_dir=cfg.cluster.scratch_path),
        )
        if comm:
            save_spec(spec)
            report.checks.append(_local_comm(spec))
    print(format_table([report]))
    if report.failed:
        print(failure_message([report]), file=sys.stderr)
        return 1
    return 0


def _local_comm(spec: Any) -> Check:
    """Run train.observe.preflight_comm over this node's ranks (as the local runner
    would start them) and read its result."""
    from launcher.run.local import free_port

    ranks = spec.plan.ranks_per_node
    port = free_port()
    procs = []
    for r in range(ranks):
        env = without_secrets(os.environ)
        env.update(spec.cfg.cluster.env)
        env.update(
            RANK=str(r),
            WORLD_SIZE=str(ranks),
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE=str(ranks),
            GROUP_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // ranks)),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "train.observe.preflight_comm", spec.run_dir, "--single-node"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    errs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        errs.append(err)
    result = Path(spec.run_dir) / RESULTS_DIR / ALLREDUCE_FILE
    if not result.exists():
        tail = (errs[0] or "").strip().splitlines()[-3:]
        return Check("allreduce", FAIL, "the all-reduce test did not finish: " + " | ".join(tail))
    return Check(**json.loads(result.read_text())["check"])
