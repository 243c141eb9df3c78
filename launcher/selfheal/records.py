"""What the supervisor writes down: its lines in the batch log (:func:`say`),
each fault in ``<run_dir>/faults.jsonl`` (and in the state's ``earlier``,
which the code-bug rule reads), and the runs root's bad-node ledger
(launcher/config/nodeledger.py): a blamed node's line, or the lines taken
back when a fault turns out to be the code's."""

from __future__ import annotations

import sys
import time
from typing import Any

from launcher.config import nodeledger
from launcher.config.health import append_fault
from launcher.selfheal.state import SupervisorState


def say(msg: str) -> None:
    print(f"meshrun supervise: {msg}", file=sys.stderr, flush=True)


class FaultRecords:
    """faults.jsonl and the ledger, for the restart and straggler policies."""

    def __init__(self, state: SupervisorState) -> None:
        self.state = state

    def record(self, fault: dict[str, Any]) -> None:
        fault["time"] = time.time()
        append_fault(self.state.run_dir, fault)
        self.state.earlier.append(fault)

    def ledger_add(self, node: str, fault: dict[str, Any]) -> None:
        st = self.state
        rec = {
            "node": node,
            "cause": fault["cause"],
            "run": st.spec.run_id or st.run_dir,
            "run_dir": st.run_dir,
            "job": st.job,
            "detail": str(fault.get("error", ""))[:200],
        }
        if "score" in fault:  # a straggler's: its probe time over its peers' median
            rec["score"] = fault["score"]
        nodeledger.append_or_say(st.ledger, rec, say)

    def ledger_retract(self, nodes: set[str], why: str) -> None:
        st = self.state
        for node in sorted(nodes):
            rec = {"node": node, "run": st.spec.run_id or st.run_dir, "retract": True, "cause": why[:200]}
            nodeledger.append_or_say(st.ledger, rec, say)
