"""The supervisor's straggler handling (mixed into ``Supervisor``,
launcher/selfheal/supervisor.py): launcher/selfheal/straggler.py's rule on each
attempt's heartbeats, a fault per node newly flagged, and under
``launcher.straggler=replace`` the swap for a spare at the next step."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

from launcher.config.schema import RunConfig
from launcher.selfheal.attempt import Attempt
from launcher.selfheal.restart import say
from launcher.selfheal.straggler import StragglerWatch, write_scores


class StragglerPolicy:
    """Straggler verdicts of the running attempt (needs the supervisor's
    ``record``, ``ledger_add``, ``healthy`` and ``excluded``)."""

    run_dir: str
    job: str
    world: int
    cfg: RunConfig
    excluded: dict[str, str]

    if TYPE_CHECKING:  # RestartPolicy's (launcher/selfheal/restart.py), the other mixin of Supervisor

        def healthy(self) -> list[str]: ...
        def record(self, fault: dict[str, Any]) -> None: ...
        def ledger_add(self, node: str, fault: dict[str, Any]) -> None: ...

    def _watch_stragglers(self, a: Attempt, hbs: dict[int, dict[str, Any]]) -> None:
        """launcher/selfheal/straggler.py's rule on the ranks' probes; a node newly
        flagged: a fault (cause straggler, its score), the ledger, and under
        launcher.straggler=replace with a spare left, USR2 to the step: the
        ranks save at the next step and exit; main() restarts without it."""
        lc = self.cfg.launcher
        if lc.straggler == "off":
            return
        if a.stragglers is None:
            a.stragglers = StragglerWatch(lc, self.world)
        nodes, new = a.stragglers.observe(hbs)
        if nodes:
            try:
                write_scores(self.run_dir, a.tag, nodes, set(a.stragglers.flagged))
            except OSError as e:
                say(f"could not write the straggler scores: {e}")
        for v in new:
            self._straggler_fault(a, v, hbs)

    def _straggler_fault(self, a: Attempt, v: dict[str, Any], hbs: dict[int, dict[str, Any]]) -> None:
        assert a.proc is not None and a.stragglers is not None
        node, lc = v["node"], self.cfg.launcher
        spares = [x for x in self.healthy() if x not in a.nodes and x != node]
        replace = lc.straggler == "replace" and bool(spares) and a.replace is None
        step = max((int(h.get("step", 0)) for h in hbs.values()), default=0)
        now = time.time()
        fault = {
            "job": self.job,
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
        self.record(fault)
        self.ledger_add(node, fault)
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
            self.excluded[node] = "straggler"
            a.proc.send_signal(signal.SIGUSR2)
