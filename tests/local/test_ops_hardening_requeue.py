"""A requeue's ExcNodeList merges the job's and the poisoned ledger's checked
names (issue 35, item 6; asks sinfo, so a process: the rest is in
tests/unit/test_ops_hardening.py)."""

from __future__ import annotations

from pathlib import Path

from harness import INJECTED_NODE, poisoned_ledger

from launcher.config import nodeledger


def test_requeue_exclusions_merge_the_jobs_and_the_ledgers(tmp_path: Path) -> None:
    """ExcNodeList after a requeue = the job's own (job_excluded, from
    scontrol: tests/cluster/test_selfheal.py proves it on the cluster) + the
    ledger's bad nodes + the new ones, each checked."""
    import time

    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.selfheal.records import FaultRecords
    from launcher.selfheal.restart import RestartPolicy
    from launcher.selfheal.state import SupervisorState

    poisoned_ledger(tmp_path / nodeledger.LEDGER_FILE, time.time())
    cfg = compose(["cluster=testcluster", "model=tiny", f"launcher.runs_root={tmp_path}"])
    st = SupervisorState(
        str(tmp_path), RunSpec(cfg, make_plan(cfg), str(tmp_path)), nodeledger.ledger_path(cfg)
    )
    pol = RestartPolicy(st, FaultRecords(st))
    assert pol.excluded_after_requeue(["node2", "node1"]) == "node1,node2,node4"
    assert pol.excluded_after_requeue([INJECTED_NODE]) == "node4"
