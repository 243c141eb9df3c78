"""What the batch-level supervisor (launcher/selfheal/supervisor.py) does after a
fault: record it (``faults.jsonl``, the bad-node ledger), tell the code's
bug from a node's, and choose the next attempt's nodes and layout:

- enough healthy nodes for the plan (``cluster.spare_nodes``): restart on
  them at the planned layout;
- fewer: restart on the healthy nodes at a smaller data-parallel degree
  when the plan allows one (launcher/plan/shrink.py: TP and PP unchanged,
  the global batch kept by more gradient accumulation). The shrunk plan is
  written to ``<run_dir>/attempt_plans/<attempt>.json`` and the tasks read
  it through ``$MESHRUN_PLAN_FILE`` (spec.json is never rewritten); the
  checkpoint reshards at resume;
- no layout fits: requeue the job with the bad nodes in ``ExcNodeList``;
  also when one fits but no left-out node can grow back and a requeue for
  a full allocation is cheaper and no later (launcher/selfheal/shrinkchoice.py,
  ``launcher.requeue_when_cheaper``).

A node counts as gone when Slurm says so: its state (down, draining,
failing) or its removal from the job's allocation (``--no-kill`` keeps the
job when a node fails, without that node).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from launcher.config import nodeledger, nodename
from launcher.config.health import STEP_PHASES, append_fault
from launcher.config.plandata import Plan
from launcher.config.spec import PLAN_FILE_ENV, RunSpec, save_attempt_plan
from launcher.plan.shrink import shrink_plan, shrink_summary
from launcher.selfheal import shrinkchoice
from launcher.slurm.nodestate import hostnames, node_bad_state, slurm_cmd
from launcher.views.runforecast import measured_step_s, restart_cost_s

POLL_S = 1.0


def say(msg: str) -> None:
    print(f"meshrun supervise: {msg}", file=sys.stderr, flush=True)


def job_excluded(job: str) -> list[str]:
    """The job's ``ExcNodeList`` as Slurm holds it (the ledger's nodes at
    submission, earlier requeues'), each name checked; [] when none."""
    out = slurm_cmd(["scontrol", "-o", "show", "job", job]) if job else None
    for word in out.stdout.split() if out else []:
        if word.startswith("ExcNodeList=") and word != "ExcNodeList=(null)":
            return [n for n in hostnames(word.split("=", 1)[1]) if nodename.is_node_name(n)]
    return []


def job_nodes(job: str) -> list[str] | None:
    """The job's allocation as Slurm holds it now (a failed node is removed
    from a ``--no-kill`` job); None when Slurm cannot say."""
    if not job:
        return None
    out = slurm_cmd(["scontrol", "-o", "show", "job", job])
    for word in out.stdout.split():
        if word.startswith("NodeList=") and word != "NodeList=(null)":
            return hostnames(word.split("=", 1)[1]) or None
    return None


def left_out_held(job: str, alloc: list[str], excluded: dict[str, str], used: list[str]) -> list[str]:
    """Nodes left out of an attempt on ``used`` (excluded after a fault) that
    the job still holds and Slurm calls healthy: the ones that may grow back."""
    now = job_nodes(job)
    return [
        n
        for n in alloc
        if n in excluded and n not in used and (now is None or n in now) and not node_bad_state(n)
    ]


class RestartPolicy:
    """The supervisor's fault handling (mixed into ``Supervisor``)."""

    run_dir: str
    spec: RunSpec
    job: str
    alloc: list[str]
    excluded: dict[str, str]
    earlier: list[dict[str, Any]]
    ledger: Path
    restarts_left: int
    plan: Plan  # the layout of the current attempt
    plan_env: dict[str, str]  # what the tasks get to run it ($MESHRUN_PLAN_FILE)
    requeue_why: str  # set when the forecast chose a requeue over a shrink (main() requeues)

    # --- layout -----------------------------------------------------------
    def healthy(self) -> list[str]:
        """Allocation nodes not excluded and still in the job's allocation."""
        now = job_nodes(self.job)
        return [x for x in self.alloc if x not in self.excluded and (now is None or x in now)]

    def layout_for(self, healthy: list[str]) -> tuple[Plan | None, str]:
        """spec.json's plan when enough nodes are healthy, else a shrunk one;
        (None, why none fits) when the job must be requeued."""
        if len(healthy) >= self.spec.plan.nodes:
            return self.spec.plan, ""
        if self.spec.cfg.job.kind == "script":
            # A team's program sized itself for the planned world (Lightning's
            # num_nodes, a sharded checkpoint): meshrun cannot reshard it.
            return None, "job=script runs on its planned nodes only (meshrun does not reshard a program)"
        return shrink_plan(self.spec.plan, self.spec.cfg.model, len(healthy))

    def use_plan(self, plan: Plan, tag: str) -> None:
        """Run the next attempt (``tag``) at ``plan``: its own plan file when
        it is not spec.json's."""
        self.plan = plan
        self.plan_env = {}
        if plan is not self.spec.plan:
            path = save_attempt_plan(self.spec, plan, tag, plan.reasons[-1])
            self.plan_env = {PLAN_FILE_ENV: str(path)}

    # --- records ------------------------------------------------------------
    def code_bug(self, fault: dict[str, Any]) -> dict[str, Any] | None:
        """An earlier fault of this run with the same error at the same step on
        another node (or on none): the code's, not a node's."""
        if fault["cause"] not in ("error", "hang", "signal", "exit"):
            return None
        for f in self.earlier:
            if (
                f.get("error") == fault["error"]
                and f.get("step") == fault["step"]
                and (f.get("node") != fault.get("node") or fault.get("node") is None)
            ):
                return f
        return None

    def record(self, fault: dict[str, Any]) -> None:
        fault["time"] = time.time()
        append_fault(self.run_dir, fault)
        self.earlier.append(fault)

    def ledger_add(self, node: str, fault: dict[str, Any]) -> None:
        rec = {
            "node": node,
            "cause": fault["cause"],
            "run": self.spec.run_id or self.run_dir,
            "run_dir": self.run_dir,
            "job": self.job,
            "detail": str(fault.get("error", ""))[:200],
        }
        if "score" in fault:  # a straggler's: its probe time over its peers' median
            rec["score"] = fault["score"]
        nodeledger.append_or_say(self.ledger, rec, say)

    def ledger_retract(self, nodes: set[str], why: str) -> None:
        for node in sorted(nodes):
            rec = {"node": node, "run": self.spec.run_id or self.run_dir, "retract": True, "cause": why[:200]}
            nodeledger.append_or_say(self.ledger, rec, say)

    # --- after a fault ------------------------------------------------------
    def after_fault(self, fault: dict[str, Any], rc: int) -> int | None:
        """Record ``fault`` and decide: the exit code to return (stop, give
        up), or None to start the next attempt (the loop then restarts on
        the healthy nodes at the layout chosen here, or requeues)."""
        if fault.get("node") is not None and (why := nodename.problem(fault["node"])) is not None:
            # A name read back from a rank's heartbeat or srun's text: never recorded or excluded.
            fault.setdefault("evidence", {})["unusable_node"] = why
            fault["node"] = None
        bug = self.code_bug(fault)
        if bug is not None:
            fault["action"] = "stop: code bug"
            self.record(fault)
            blamed = {f["node"] for f in self.earlier if f.get("error") == fault["error"] and f.get("node")}
            self.ledger_retract(blamed, f"same error at step {fault['step']} on several nodes: the code's")
            say(
                f"stopping: the same error at step {fault['step']} on different nodes twice (attempts "
                f"{bug.get('attempt')} and {fault['attempt']}) is the code's, not a node's: {fault['error']}"
            )
            return rc or 1
        node = fault.get("node")
        if node:
            self.excluded[node] = fault["cause"]
            self.ledger_add(node, fault)
        if self.restarts_left <= 0:
            fault["action"] = "give up"
            self.record(fault)
            say(
                f"giving up after a {fault['cause']} on {node or 'no single node'} ({fault['error']}): "
                f"launcher.max_restarts={self.spec.cfg.launcher.max_restarts} used up"
            )
            return rc or 1
        healthy = self.healthy()
        plan, why = self.layout_for(healthy)
        if plan is not None and plan is not self.spec.plan:
            fault["shrink"] = shrink_summary(self.spec.plan, plan)
            choice = self.shrink_or_requeue(plan, healthy, int(fault.get("step") or 0))
            if choice is not None:
                fault["choice"] = choice.figures | {"why": choice.why}
                say(choice.why)
                if choice.requeue:
                    plan, self.requeue_why = None, choice.why
        fault["action"] = "restart" if plan is not None else "requeue"
        if plan is None and len(healthy) < self.spec.plan.nodes and "choice" not in fault:
            fault["no_smaller_layout"] = why
        self.record(fault)
        say(
            f"{fault['cause']} on {node or 'no single node'} at step {fault['step']}: {fault['error']}; "
            f"{fault['action']} ({self.restarts_left - 1} restart(s) left)"
            + (f", without {','.join(sorted(self.excluded))}" if self.excluded else "")
        )
        if plan is not None and plan is not self.spec.plan:
            say(
                f"no spare node left: restarting on {len(healthy[: plan.nodes])} healthy node(s) at a "
                f"smaller data-parallel degree: {plan.reasons[-1]}"
            )
        self.restarts_left -= 1
        return None

    def shrink_or_requeue(self, plan: Plan, healthy: list[str], step: int) -> shrinkchoice.Choice | None:
        """None when grow back can follow (a left-out node the job still
        holds, Slurm calling it healthy) or the choice is off; else the
        forecast's choice between training on at ``plan`` and a requeue."""
        lc = self.spec.cfg.launcher
        if not lc.requeue_when_cheaper:
            return None
        if lc.grow_back and left_out_held(self.job, self.alloc, self.excluded, healthy[: plan.nodes]):
            return None  # its burn-ins come first (launcher/selfheal/growback.py)
        held = job_nodes(self.job) or list(self.alloc)
        gpn = self.spec.cfg.cluster.gpus_per_node
        now = time.time()
        wait_s, note = shrinkchoice.full_start_wait_s(self.job, len(self.alloc), sorted(self.excluded), now)
        if wait_s is None:
            say(f"no start estimate for a full allocation ({note})")
        restart_s, basis = restart_cost_s(self.run_dir, lc.runs_root)
        choice = shrinkchoice.choose(
            remaining_steps=max(0, self.spec.cfg.train.steps - step),
            step_s=measured_step_s(self.run_dir),
            dp_planned=self.spec.plan.dp,
            dp_shrunk=plan.dp,
            restart_s=restart_s,
            wait_s=wait_s,
            held_gpus=len(held) * gpn,
            full_gpus=len(self.alloc) * gpn,
        )
        choice.figures["restart_basis"] = basis
        return choice

    def excluded_after_requeue(self, bad: list[str]) -> str:
        """The requeued job's ExcNodeList: ``bad`` added to what the job
        already excludes (the ledger's at submission, earlier requeues') and
        to the ledger's bad nodes now, each name checked."""
        lc = self.spec.cfg.launcher
        ledger = nodeledger.bad_nodes(
            nodeledger.read(self.ledger, say), lc.bad_node_faults, lc.bad_node_window_h
        )
        names = [*job_excluded(self.job), *ledger, *(n for n in bad if nodename.is_node_name(n))]
        return nodename.node_list(self.startable(list(dict.fromkeys(names)), bad))

    def startable(self, exclude: list[str], bad: list[str]) -> list[str]:
        """``exclude`` less what would leave the job's partition too few nodes
        to ever start it (Slurm keeps such a job pending, BadConstraints):
        the oldest exclusions go first, this fault's nodes last; said."""
        c = self.spec.cfg
        need = self.spec.plan.nodes + c.cluster.spare_nodes
        out = slurm_cmd(["sinfo", "-h", "-p", c.qos.partition, "-o", "%N"])
        part = [n for expr in out.stdout.split() for n in hostnames(expr)] if out.returncode == 0 else []
        if not part:
            return exclude  # Slurm cannot say: keep them all
        keep = list(exclude)
        for name in [n for n in exclude if n not in bad] + [n for n in exclude if n in bad]:
            if len([n for n in part if n not in keep]) >= need:
                break
            keep.remove(name)
        if keep != exclude:
            say(
                f"partition {c.qos.partition} has {len(part)} node(s) and the job needs {need}: "
                f"not excluding {','.join(n for n in exclude if n not in keep)}"
            )
        return keep

    def requeue_without(self, bad: list[str], why: str = "") -> int:
        exclude = self.excluded_after_requeue(bad)  # read before the requeue resets the job
        say(
            f"too few healthy nodes left ({len(self.alloc) - len(bad)} of {self.spec.plan.nodes} needed"
            + (f"; {why}" if why else "")
            + f"): requeueing job {self.job} without {','.join(bad)}: ExcNodeList={exclude}"
        )
        if slurm_cmd(["scontrol", "requeue", self.job]).returncode:
            say(f"scontrol requeue {self.job} failed: giving up")
            return 1
        for _ in range(10):
            out = slurm_cmd(["scontrol", "update", f"JobId={self.job}", f"ExcNodeList={exclude}"])
            if out.returncode == 0:
                break
            time.sleep(0.5)
        else:
            say(
                f"scontrol update JobId={self.job} ExcNodeList={exclude} failed ({(out.stderr or out.stdout).strip()}):"
                f" the requeued job may start on {','.join(bad)} again"
            )
        return 0

    def watch_resume(self, fault: dict[str, Any], a: Any, stop: threading.Event) -> None:
        """Once the restarted step reaches its first step: seconds lost, steps redone."""
        while not stop.wait(POLL_S):
            hbs = self._heartbeats(a)
            # A beat's first_step: the rank's first training step, carried on
            # (a node file samples beats once a second: a short attempt's
            # step beats may all fall between two samples).
            first = [
                (int(h["first_step"]), float(h["first_step_at"]))
                if "first_step" in h
                else (int(h["step"]), float(h["time"]))
                for h in hbs.values()
                if "first_step" in h or h.get("phase") in STEP_PHASES
            ]
            if first:
                step = min(s for s, _ in first)
                at = min(t for _, t in first)
                rec = {
                    "event": "resumed",
                    "job": self.job,
                    "attempt": a.tag,
                    "after_fault_attempt": fault["attempt"],
                    "cause": fault["cause"],
                    "first_step": step,
                    "seconds_lost": round(at - float(fault["fault_at"]), 2),
                    "detect_s": round(float(fault["detected_at"]) - float(fault["fault_at"]), 2),
                    "steps_redone": max(0, int(fault["step"]) - step),
                    "world_size": self.plan.world_size,
                    "dp": self.plan.dp,
                }
                append_fault(self.run_dir, rec)
                say(
                    f"resumed at step {step}: {rec['seconds_lost']} s after the fault, "
                    f"{rec['steps_redone']} step(s) redone"
                )
                return
