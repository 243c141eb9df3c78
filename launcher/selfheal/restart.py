"""What the batch-level supervisor (launcher/selfheal/supervisor.py) does after a
fault: record it (through launcher/selfheal/records.py: ``faults.jsonl``, the
bad-node ledger), tell the code's bug from a node's, and choose the next
attempt's nodes and layout:

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

import threading
import time
from typing import Any

from launcher.config import nodeledger, nodename
from launcher.config.health import STEP_PHASES, append_fault
from launcher.config.plandata import Plan
from launcher.config.spec import PLAN_FILE_ENV, RunSpec, save_attempt_plan
from launcher.plan.shrink import shrink_plan, shrink_summary
from launcher.selfheal import shrinkchoice
from launcher.selfheal.records import FaultRecords, say
from launcher.selfheal.state import SupervisorState
from launcher.selfheal.step import Attempt, attempt_heartbeats
from launcher.slurm.nodestate import hostnames, node_bad_state, slurm_cmd
from launcher.views.runforecast import measured_step_s, restart_cost_s

POLL_S = 1.0


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


def healthy_nodes(state: SupervisorState) -> list[str]:
    """Allocation nodes not excluded and still in the job's allocation."""
    now = job_nodes(state.job)
    return [x for x in state.alloc if x not in state.excluded and (now is None or x in now)]


def layout_for(spec: RunSpec, healthy: list[str]) -> tuple[Plan | None, str]:
    """spec.json's plan when enough nodes are healthy, else a shrunk one;
    (None, why none fits) when the job must be requeued."""
    if len(healthy) >= spec.plan.nodes:
        return spec.plan, ""
    if spec.cfg.job.kind == "script":
        # A team's program sized itself for the planned world (Lightning's
        # num_nodes, a sharded checkpoint): meshrun cannot reshard it.
        return None, "job=script runs on its planned nodes only (meshrun does not reshard a program)"
    return shrink_plan(spec.plan, spec.cfg.model, len(healthy))


class RestartPolicy:
    """What follows a fault: the code's bug or a node's, restart (at which
    layout) or requeue; reads and changes the shared ``state``."""

    def __init__(self, state: SupervisorState, records: FaultRecords) -> None:
        self.state = state
        self.records = records

    # --- layout -----------------------------------------------------------
    def use_plan(self, plan: Plan, tag: str) -> None:
        """Run the next attempt (``tag``) at ``plan``: its own plan file when
        it is not spec.json's."""
        st = self.state
        st.plan = plan
        st.plan_env = {}
        if plan is not st.spec.plan:
            path = save_attempt_plan(st.spec, plan, tag, plan.reasons[-1])
            st.plan_env = {PLAN_FILE_ENV: str(path)}

    # --- after a fault ------------------------------------------------------
    def code_bug(self, fault: dict[str, Any]) -> dict[str, Any] | None:
        """An earlier fault of this run with the same error at the same step on
        another node (or on none): the code's, not a node's."""
        st = self.state
        if fault["cause"] not in ("error", "hang", "signal", "exit", "wrapper"):
            return None
        for f in st.earlier:
            if (
                f.get("error") == fault["error"]
                and f.get("step") == fault["step"]
                and (f.get("node") != fault.get("node") or fault.get("node") is None)
            ):
                return f
        return None

    def after_fault(self, fault: dict[str, Any], rc: int) -> int | None:
        """Record ``fault`` and decide: the exit code to return (stop, give
        up), or None to start the next attempt (the loop then restarts on
        the healthy nodes at the layout chosen here, or requeues)."""
        st = self.state
        if fault.get("node") is not None and (why := nodename.problem(fault["node"])) is not None:
            # A name read back from a rank's heartbeat or srun's text: never recorded or excluded.
            fault.setdefault("evidence", {})["unusable_node"] = why
            fault["node"] = None
        bug = self.code_bug(fault)
        if bug is not None:
            fault["action"] = "stop: code bug"
            self.records.record(fault)
            blamed = {f["node"] for f in st.earlier if f.get("error") == fault["error"] and f.get("node")}
            self.records.ledger_retract(
                blamed, f"same error at step {fault['step']} on several nodes: the code's"
            )
            say(
                f"stopping: the same error at step {fault['step']} on different nodes twice (attempts "
                f"{bug.get('attempt')} and {fault['attempt']}) is the code's, not a node's: {fault['error']}"
            )
            return rc or 1
        node = fault.get("node")
        if node:
            st.excluded[node] = fault["cause"]
            self.records.ledger_add(node, fault)
        if st.restarts_left <= 0:
            fault["action"] = "give up"
            self.records.record(fault)
            say(
                f"giving up after a {fault['cause']} on {node or 'no single node'} ({fault['error']}): "
                f"launcher.max_restarts={st.spec.cfg.launcher.max_restarts} used up"
            )
            return rc or 1
        healthy = healthy_nodes(st)
        plan, why = layout_for(st.spec, healthy)
        if plan is not None and plan is not st.spec.plan:
            fault["shrink"] = shrink_summary(st.spec.plan, plan)
            choice = self.shrink_or_requeue(plan, healthy, int(fault.get("step") or 0))
            if choice is not None:
                fault["choice"] = choice.figures | {"why": choice.why}
                say(choice.why)
                if choice.requeue:
                    plan, st.requeue_why = None, choice.why
        fault["action"] = "restart" if plan is not None else "requeue"
        if plan is None and len(healthy) < st.spec.plan.nodes and "choice" not in fault:
            fault["no_smaller_layout"] = why
        self.records.record(fault)
        say(
            f"{fault['cause']} on {node or 'no single node'} at step {fault['step']}: {fault['error']}; "
            f"{fault['action']} ({st.restarts_left - 1} restart(s) left)"
            + (f", without {','.join(sorted(st.excluded))}" if st.excluded else "")
        )
        if plan is not None and plan is not st.spec.plan:
            say(
                f"no spare node left: restarting on {len(healthy[: plan.nodes])} healthy node(s) at a "
                f"smaller data-parallel degree: {plan.reasons[-1]}"
            )
        st.restarts_left -= 1
        return None

    def shrink_or_requeue(self, plan: Plan, healthy: list[str], step: int) -> shrinkchoice.Choice | None:
        """None when grow back can follow (a left-out node the job still
        holds, Slurm calling it healthy) or the choice is off; else the
        forecast's choice between training on at ``plan`` and a requeue."""
        st = self.state
        lc = st.spec.cfg.launcher
        if not lc.requeue_when_cheaper:
            return None
        if lc.grow_back and left_out_held(st.job, st.alloc, st.excluded, healthy[: plan.nodes]):
            return None  # its burn-ins come first (launcher/selfheal/growback.py)
        held = job_nodes(st.job) or list(st.alloc)
        gpn = st.spec.cfg.cluster.gpus_per_node
        now = time.time()
        wait_s, note = shrinkchoice.full_start_wait_s(st.job, len(st.alloc), sorted(st.excluded), now)
        if wait_s is None:
            say(f"no start estimate for a full allocation ({note})")
        restart_s, basis = restart_cost_s(st.run_dir, lc.runs_root)
        choice = shrinkchoice.choose(
            remaining_steps=max(0, st.spec.cfg.train.steps - step),
            step_s=measured_step_s(st.run_dir),
            dp_planned=st.spec.plan.dp,
            dp_shrunk=plan.dp,
            restart_s=restart_s,
            wait_s=wait_s,
            held_gpus=len(held) * gpn,
            full_gpus=len(st.alloc) * gpn,
        )
        choice.figures["restart_basis"] = basis
        return choice

    def excluded_after_requeue(self, bad: list[str]) -> str:
        """The requeued job's ExcNodeList: ``bad`` added to what the job
        already excludes (the ledger's at submission, earlier requeues') and
        to the ledger's bad nodes now, each name checked."""
        st = self.state
        lc = st.spec.cfg.launcher
        ledger = nodeledger.bad_nodes(
            nodeledger.read(st.ledger, say), lc.bad_node_faults, lc.bad_node_window_h
        )
        names = [*job_excluded(st.job), *ledger, *(n for n in bad if nodename.is_node_name(n))]
        return nodename.node_list(self.startable(list(dict.fromkeys(names)), bad))

    def startable(self, exclude: list[str], bad: list[str]) -> list[str]:
        """``exclude`` less what would leave the job's partition too few nodes
        to ever start it (Slurm keeps such a job pending, BadConstraints):
        the oldest exclusions go first, this fault's nodes last; said."""
        st = self.state
        c = st.spec.cfg
        need = st.spec.plan.nodes + c.cluster.spare_nodes
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
        st = self.state
        exclude = self.excluded_after_requeue(bad)  # read before the requeue resets the job
        say(
            f"too few healthy nodes left ({len(st.alloc) - len(bad)} of {st.spec.plan.nodes} needed"
            + (f"; {why}" if why else "")
            + f"): requeueing job {st.job} without {','.join(bad)}: ExcNodeList={exclude}"
        )
        if slurm_cmd(["scontrol", "requeue", st.job]).returncode:
            say(f"scontrol requeue {st.job} failed: giving up")
            return 1
        for _ in range(10):
            out = slurm_cmd(["scontrol", "update", f"JobId={st.job}", f"ExcNodeList={exclude}"])
            if out.returncode == 0:
                break
            time.sleep(0.5)
        else:
            say(
                f"scontrol update JobId={st.job} ExcNodeList={exclude} failed ({(out.stderr or out.stdout).strip()}):"
                f" the requeued job may start on {','.join(bad)} again"
            )
        return 0

    def watch_resume(self, fault: dict[str, Any], a: Attempt, stop: threading.Event) -> None:
        """Once the restarted step reaches its first step: seconds lost, steps redone."""
        st = self.state
        while not stop.wait(POLL_S):
            hbs = attempt_heartbeats(st.run_dir, a.tag)
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
                    "job": st.job,
                    "attempt": a.tag,
                    "after_fault_attempt": fault["attempt"],
                    "cause": fault["cause"],
                    "first_step": step,
                    "seconds_lost": round(at - float(fault["fault_at"]), 2),
                    "detect_s": round(float(fault["detected_at"]) - float(fault["fault_at"]), 2),
                    "steps_redone": max(0, int(fault["step"]) - step),
                    "world_size": st.plan.world_size,
                    "dp": st.plan.dp,
                }
                append_fault(st.run_dir, rec)
                say(
                    f"resumed at step {step}: {rec['seconds_lost']} s after the fault, "
                    f"{rec['steps_redone']} step(s) redone"
                )
                return
