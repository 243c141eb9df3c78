"""The Python API's handles end and refuse where the CLI would (issue: one run, one record)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher import api
from launcher.views.runstate import Row


def test_sweep_into_a_dir_that_holds_a_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"points": [{"run_dir": "old", "job_id": "1"}]}))
    with pytest.raises(api.SweepFailed, match=r"already holds a sweep .*api\.follow"):
        api.sweep(["train.lr=1e-3,3e-3", f"hydra.sweep.dir={tmp_path}"])
    # Following it is explicit, and gives the old sweep's handles.
    runs = api.follow(tmp_path)
    assert [(r.run_dir, r.job_id) for r in runs] == [("old", "1")]


def test_follow_of_a_dir_without_manifest_says_so(tmp_path: Path) -> None:
    with pytest.raises(api.SweepFailed, match="is not a sweep dir"):
        api.follow(tmp_path)


@pytest.mark.parametrize(("queued", "done"), [([], True), ([{"JobID": "42"}], False)])
def test_wait_ends_for_a_preempted_job_unless_it_was_requeued(
    monkeypatch: pytest.MonkeyPatch, queued: list[dict[str, str]], done: bool
) -> None:
    from launcher.slurm import cluster

    run = api.Run("/nonexistent/run", "42")
    monkeypatch.setattr(api.Run, "status", lambda self: Row("-", self.run_dir, "42", state="PREEMPTED"))
    monkeypatch.setattr(cluster, "queue", lambda: queued)
    assert run.done() is done
    if done:
        assert run.wait(timeout_s=1, poll_s=0.01).state == "PREEMPTED"
    else:
        with pytest.raises(TimeoutError, match="still PREEMPTED"):
            run.wait(timeout_s=0.05, poll_s=0.01)


def test_plan_of_a_refused_request_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """api.plan() carries the dry run's verdict as data (the CLI prints it)."""
    from launcher.slurm import cluster

    def refuse(spec):  # type: ignore[no-untyped-def]
        raise cluster.SlurmError("qos=research allows 12 GPUs; this request holds 32")

    monkeypatch.setattr(cluster, "slurm_reachable", lambda: True)
    monkeypatch.setattr(cluster, "check_request", refuse)
    p = api.plan(["model=13b", "cluster=4node"])
    assert p.refused == "qos=research allows 12 GPUs; this request holds 32"
    assert p.verdict is not None and p.verdict.asked


def test_plan_without_slurm_gives_the_share_note(monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.slurm import cluster

    monkeypatch.setattr(cluster, "slurm_reachable", lambda: False)
    p = api.plan(["model=13b", "cluster=4node", "cluster.nodes=64"])
    assert p.refused is None and p.verdict is not None and not p.verdict.asked
    assert "larger than cluster=4node itself (4 nodes, 32 GPUs" in (p.verdict.note or "")
