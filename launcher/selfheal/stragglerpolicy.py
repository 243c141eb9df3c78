"""The supervisor's straggler handling (a part of ``Supervisor``,
launcher/selfheal/supervisor.py): launcher/selfheal/straggler.py's rule on each
attempt's heartbeats, a fault per node newly flagged, and under
``launcher.straggler=replace`` the swap for a spare at the next step."""

from __future__ import annotations

import signal
import time
from typing import Any

from launcher.selfheal.records import FaultRecords, say
from launcher.selfheal.restart import healthy_nodes
from launcher.selfheal.state import SupervisorState
from launcher.selfheal.step import Attempt
from launcher.selfheal.straggler import StragglerWatch, write_scores


class StragglerPolicy:
    """Straggler verdicts of the running attempt: faults and ledger lines
    through ``records``; a replaced node goes into ``state.excluded``."""

    def __init__(self, state: SupervisorState, records: FaultRecords) -> None:
        self.state = state
        self.records = records

    def watch(self, a: Attempt, hbs: dict[int, dict[str, Any]]) -> None:
        """launcher/selfheal/straggler.py's rule on the ranks' probes; a node newly
        flagged: a fault (cause straggler, its score), the ledger, and under
        launcher.straggler=replace with a spare left, USR2 to the step: the
        ranks save at the next step and exit; main() restarts without it."""
        st = self.state
        lc = st.cfg.launcher
        if lc.straggler == "off":
            return
        if a.stragglers is None:
            a.stragglers = StragglerWatch(lc, st.plan.world_size)
        nodes, new = a.stragglers.observe(hbs)
        if nodes:
            try:
                write_scores(st.run_dir, a.tag, nodes, set(a.stragglers.flagged))
            except OSError as e:
                say(f"could not write the straggler scores: {e}")
        for v in new:
            self._straggler_fault(a, v, hbs)

    def _straggler_fault(self, a: Attempt, v: dict[str, Any], hbs: dict[int, dict[str, Any]]) -> None:
        assert a.proc is not None and a.stragglers is not None
        st = self.state
        node, lc = v["node"], st.cfg.launcher
        spares = [x for x in healthy_nodes(st) if x not in a.nodes and x != node]
        replace = lc.straggler == "replace" and bool(spares) and a.replace is None
        step = max((int(h.get("step", 0)) for h in hbs.values()), default=0)
        now = time.time()
        fault = {
            "job": st.job,
            "attempt": a.tag,
            "nodes": a.nodes,
            "cause": "straggler",
            "node": node,
            "score": v["score"],
            "step": step,
            "error": f"solo probe {v['score']:g} x its peers' median on rank(s) {v['ranks']}",
            "evidence": {"rule": a.stragglers.rule(), "straggling_ranks": v["ranks"], "ranks": v["verdicts"]},
            "fault_at": now,
            "detected_at": now,
            "action": "replace" if replace else "warn",
        }
        if lc.straggler == "replace" and not replace:
            fault["evidence"]["note"] = (
                "no spare node left: warned only" if not spares else "a replace is under way"
            )
        self.records.record(fault)
        self.records.ledger_add(node, fault)
        say(
            f"straggler: {node} (rank(s) {v['ranks']}, score {v['score']:g}: {a.stragglers.rule()}); "
            + (
                f"replacing it with a spare ({spares[0]}): USR2 to attempt {a.tag}, the ranks save and stop"
                if replace
                else f"warn only (launcher.straggler={lc.straggler}"
                + (", no spare node left)" if lc.straggler == "replace" else ")")
            )
        )
        if replace:
            a.replace = fault
            st.excluded[node] = "straggler"
            a.proc.send_signal(signal.SIGUSR2)
