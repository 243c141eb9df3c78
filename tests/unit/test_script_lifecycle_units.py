"""A foreign program's lifecycle, the supervisor's and the validation's side
(no process started): the wrapper's own failure is the run's error, not a
node's (launcher/selfheal/attribution.py); the teardown rule never ends a
quiet rank still working, and a run whose ranks were ended says so
(launcher/selfheal/hangwatch.py, hangend.py); a stop signal torchrun cannot
pass on is refused (launcher/plan/script.py). The wrapper's side:
tests/local/test_script_lifecycle.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import TOY, script_cfg

from launcher.config.compose import compose
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan
from launcher.plan.script import check_script
from launcher.selfheal import hangend
from launcher.selfheal.attribution import Evidence, attribute
from launcher.selfheal.hangwatch import HangWatch

T0 = 1000.0


def _beat(rank: int, phase: str, t: float, step: int = 0, **extra: float) -> dict:
    return {
        "rank": rank,
        "node": f"node{rank + 1}",
        "attempt": "0.0",
        "phase": phase,
        "step": step,
        "time": t,
    } | extra


def _evidence(errors: list[tuple[float, int, str]], heartbeats: dict[int, dict]) -> Evidence:
    return Evidence(
        job="42",
        attempt="0.0",
        nodes=["node1", "node2"],
        srun_exit=1,
        started_at=T0,
        job_kind="script",
        now=T0 + 10,
        heartbeats=heartbeats,
        srun_errors=[(T0 + 2, "srun: error: node1: task 0: Exited with exit code 1")],
        errors=errors,
    )


# --- finding 4: the wrapper's own failure is the run's error -----------------
def test_a_wrappers_own_failure_blames_no_node() -> None:
    """It could not start the program (its heartbeat names its node: the
    start-up beat comes first): today's rule blamed that node for the
    rank's "error"; it is the run's (a bad spec, an interpreter missing)."""
    err = "meshrun taskwrap error: cannot start /venv/bin/python: No such file or directory (before the program started)"
    fault = attribute(_evidence([(T0 + 1, 0, err)], {0: _beat(0, "startup", T0)}))
    assert (fault["cause"], fault["node"], fault["error"]) == ("wrapper", None, err), fault
    assert fault["evidence"]["ranks"] == [0] and fault["fault_at"] == T0 + 1
    # A program's own error is still its rank's node's, as before.
    own = attribute(_evidence([(T0 + 1, 1, "ValueError: boom")], {1: _beat(1, "step", T0, 3)}))
    assert (own["cause"], own["node"]) == ("error", "node2")


def test_a_task_dead_of_meshruns_stop_signal_is_a_stop_not_a_node_fault() -> None:
    """Defense in depth for the interpreter's start, before the wrapper's first
    line (some 25 ms): a task dead of USR2 (srun 140) was blamed on its node
    as a signal fault and restarted; the time limit's stop was lost."""
    from launcher.selfheal.attribution import signalled_line, stop_exit_code

    lines = [
        (1.0, "srun: error: node1: task 0: User defined signal 2"),
        (1.1, "srun: error: node1: task 1: Exited with exit code 75"),
    ]
    assert stop_exit_code(lines, (75, 76)) == 76  # requeued: what it had not saved is lost
    assert stop_exit_code(lines[:1], (75, 76)) == 76
    assert signalled_line(lines, [], weak=True) is None  # no node blamed for it
    killed = [*lines, (1.2, "srun: error: node2: task 2: Killed")]
    assert stop_exit_code(killed, (75, 76)) is None and signalled_line(killed, []) == killed[2]


# --- finding 6: the teardown rule never ends a rank still working -------------
def _watch(run: Path) -> HangWatch:
    base = ["cluster=testcluster", "cluster.nodes=1", "cluster.gpus_per_node=3",
            "launcher.hang_timeout_s=30", "launcher.hang_startup_timeout_s=100"]  # fmt: skip
    cfg = compose(["job=script", f"job.script={TOY}", *base])
    return HangWatch(RunSpec(cfg, make_plan(cfg), str(run)), lambda _: None)


def test_a_quiet_rank_still_writing_after_rank_0_completed_is_not_ended(tmp_path: Path) -> None:
    """Rank 0's program completed; ranks 1 and 2 report no step. Rank 2 is
    silent; rank 1 still writes (its heartbeat's ``active``, the wrapper's
    newest output or write of its program). While rank 1 works, nothing is
    stale (ending the step would end it too); once it too has been idle for
    the step limit, both are ended by the teardown rule, and result.json
    says which ranks were ended."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json").write_text(json.dumps({"final_step": 500, "status": "completed"}))
    w = _watch(run)
    done = _beat(0, "done", T0 + 100, 500)
    silent = _beat(2, "startup", T0)
    working = _beat(1, "startup", T0, active=T0 + 200)
    hbs = {0: done, 1: working, 2: silent}
    assert w.stale(hbs, T0 - 1, T0 + 125) == {}  # within the step limit from rank 0's end
    assert w.stale(hbs, T0 - 1, T0 + 225) == {}  # rank 2 past it, rank 1 working
    stale = w.stale(hbs, T0 - 1, T0 + 231)
    assert set(stale) == {1, 2} and stale[1]["last_beat_at"] == T0 + 200, stale
    why = hangend.program_ended("script", 3, str(run), T0 - 1, hbs, stale)
    assert why.startswith("rank 0's program completed at step 500; rank(s) [1, 2]"), why
    hangend.note_ended(str(run), {"program_ended": why, "ended_ranks": [1, 2]})
    result = json.loads((run / "result.json").read_text())
    assert (result["status"], result["ranks_ended"], result["ranks_ended_why"]) == ("completed", [1, 2], why)


def test_activity_changes_no_hang_limit_before_rank_0_completed(tmp_path: Path) -> None:
    """``active`` is read by the teardown rule only: a quiet rank that prints
    while rank 0 is silent is no proof of training."""
    w = _watch(tmp_path)
    hbs = {0: _beat(0, "step", T0, 5), 1: _beat(1, "startup", T0, active=T0 + 50), 2: _beat(2, "startup", T0)}
    assert set(w.stale(hbs, T0 - 1, T0 + 31)) == {0}


# --- finding 5: torchrun passes on only some signals -------------------------
@pytest.mark.parametrize("sig", ["SIGUSR1", "SIGUSR2"])
def test_a_stop_signal_torchrun_cannot_pass_on_is_refused(sig: str) -> None:
    """torchrun handles TERM/INT/HUP/QUIT only: USR1 killed it and orphaned
    its workers, USR2 never reached them, and the wrapper still reported a
    clean stop. Refused, naming the field and the choices."""
    cfg = script_cfg("job.launch=torchrun", f"job.stop_signal={sig}")
    with pytest.raises(ConfigError) as e:
        check_script(cfg)
    text = str(e.value)
    assert f"job.stop_signal='{sig}'" in text and "SIGTERM, SIGINT, SIGHUP, SIGQUIT" in text, text
    assert "job.launch=tasks" in text, text
    for ok in (
        script_cfg("job.launch=torchrun", "job.stop_signal=SIGINT"),
        script_cfg(f"job.stop_signal={sig}"),
    ):
        check_script(ok)  # torchrun with a signal it passes on; a task per GPU with any
