"""What follows a hang (launcher/selfheal/hangwatch.py found ranks past their
limit): every rank's stacks dumped (:data:`STACK_SIGNAL` to the step; each
rank's faulthandler writes ``<run_dir>/stacks/``), the step killed, and the
ranks that wrote no stack (a stopped process, a wedged node) named for the
attribution; and the teardown rule (:func:`program_ended`): a job=script
program that completed while a quiet rank lingers is done, not hung (a rank
still writing is never ended: launcher/selfheal/hangwatch.py waits for it),
and the run's result.json says which ranks were ended (:func:`note_ended`)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from launcher.config.health import STACK_SIGNAL, stack_path
from launcher.config.runfiles import RESULT_FILE, STACKS_DIR
from launcher.selfheal.hangwatch import completed_since
from launcher.selfheal.records import say
from launcher.selfheal.state import SupervisorState
from launcher.selfheal.step import Attempt, attempt_heartbeats
from launcher.slurm.nodestate import slurm_cmd

STACK_WAIT_S = 5.0  # time the ranks get to write their stacks
KILL_WAIT_S = 30.0  # srun's exit after SIGKILL of the step


def step_ids(state: SupervisorState, a: Attempt) -> list[str]:
    """The Slurm step ids of attempt ``a`` (its training step; under
    launcher.in_process_recovery its replacement steps too): from its
    heartbeats, else squeue's newest."""
    ids = {h.get("step_id") for h in attempt_heartbeats(state.run_dir, a.tag).values() if h.get("step_id")}
    if ids:
        return sorted((str(i) for i in ids), key=int)
    out = slurm_cmd(["squeue", "-h", "-s", "-j", state.job, "-o", "%i"])
    steps = [s.split(".", 1)[1] for s in out.stdout.split() if "." in s and s.split(".", 1)[1].isdigit()]
    return [max(steps, key=int)] if steps else []


def end_hung_step(
    state: SupervisorState, a: Attempt, hbs: dict[int, dict[str, Any]], stale: dict[int, dict[str, Any]]
) -> None:
    """Dump every rank's stacks, kill the step, and keep what was seen in
    ``a.hang`` (with ``program_ended`` when the teardown rule holds, judged
    on ``hbs`` as they were when the hang was found)."""
    ended = program_ended(state.cfg.job.kind, state.plan.world_size, state.run_dir, a.started, hbs, stale)
    detected = time.time()
    targets = [f"{state.job}.{sid}" for sid in step_ids(state, a)]
    target = ",".join(targets) or None
    say(f"hang: rank(s) {sorted(stale)} silent past the limit ({stale}); dumping stacks of step {target}")
    sent = time.time()
    if target:
        slurm_cmd(["scancel", f"--signal={STACK_SIGNAL.name}", *targets])
    time.sleep(STACK_WAIT_S)
    stacks, silent = {}, []
    after = attempt_heartbeats(state.run_dir, a.tag)
    for r in range(state.plan.world_size):
        p = stack_path(state.run_dir, a.tag, r)
        text = p.read_text() if p.exists() else ""
        if text.strip():
            stacks[r] = str(p)
        else:
            silent.append(r)
    nodes = sorted({after[r]["node"] for r in silent if r in after})
    a.hang = {
        "stale": stale,
        "unresponsive_ranks": silent,
        "unresponsive_nodes": nodes,
        STACKS_DIR: stacks,
        "signal_sent_at": sent,
        "detected_at": detected,
    }
    say(f"stacks from {len(stacks)} rank(s) in {Path(state.run_dir) / STACKS_DIR}; no answer from {silent}")
    if target:
        slurm_cmd(["scancel", "--signal=KILL", *targets])
    assert a.proc is not None
    try:
        a.proc.wait(KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        a.proc.kill()
    if ended:
        a.hang["program_ended"] = ended
        a.hang["ended_ranks"] = sorted(stale)


def drop_empty_stacks(state: SupervisorState, a: Attempt) -> None:
    """Remove the empty stack files attempt ``a``'s ranks left (no hang, or no answer)."""
    for r in range(state.plan.world_size):
        p = stack_path(state.run_dir, a.tag, r)
        try:
            if p.exists() and p.stat().st_size == 0:
                p.unlink()
        except OSError:
            pass


def program_ended(
    kind: str, world: int, run_dir: str, started: float, hbs: dict[int, dict[str, Any]], stale: dict[int, Any]
) -> str:
    """job=script: rank 0's program completed (result.json, written since
    ``started``, this attempt's start) and every rank still running is one
    that never reported a step, silent past its limit: not a hang of the
    training but of its teardown (under job.launch=tasks rank 0's process
    holds the rendezvous store; a rank whose ``destroy_process_group()``
    still needs it after rank 0 exited waits for it). The run is complete:
    say why ("" when not)."""
    if kind != "script" or len(hbs) < world or hbs.get(0, {}).get("phase") != "done":
        return ""
    lingering = [r for r, h in hbs.items() if h.get("phase") != "done"]
    if not lingering or any(r not in stale or hbs[r].get("phase") != "startup" for r in lingering):
        return ""
    result = completed_since(run_dir, started)
    if not result:
        return ""
    return (
        f"rank 0's program completed at step {result.get('final_step')}; rank(s) {lingering}, which "
        "report no step, did not exit"
    )


def note_ended(run_dir: str, hang: dict[str, Any]) -> None:
    """The completed run's result.json says its ranks that were ended after
    rank 0's program completed (``ranks_ended``, and why): a run that
    completed so is not one whose every rank exited by itself."""
    path = Path(run_dir) / RESULT_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(doc, dict):
        return
    doc.update(ranks_ended=hang.get("ended_ranks", []), ranks_ended_why=hang.get("program_ended", ""))
    tmp = path.with_name(f".result.json.{os.getpid()}")
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
