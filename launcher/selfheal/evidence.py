"""What the supervisor gathers after a failed attempt for its attribution
(launcher/selfheal/attribution.py): the ranks' heartbeats and recorded
Python errors (``failures.log``), what srun printed, and what Slurm says of
the attempt's nodes (bad states, removal from the job, addresses). All the
reading and asking is here, so that the rule itself is a pure function."""

from __future__ import annotations

import re
import time
from pathlib import Path

from launcher.config.runfiles import FAILURES_FILE
from launcher.selfheal.attribution import Evidence, named_peers, nodes_at, signalled_line
from launcher.selfheal.restart import job_nodes
from launcher.selfheal.state import SupervisorState
from launcher.selfheal.step import Attempt, attempt_heartbeats
from launcher.slurm.nodestate import node_addresses, node_bad_state


def python_errors(run_dir: str, job: str, started: float) -> list[tuple[float, int, str]]:
    """(time, rank, error) recorded by ranks since ``started``, oldest first."""
    path = Path(run_dir) / FAILURES_FILE
    out = []
    if path.exists():
        pat = re.compile(rf"^{re.escape(job or 'local')} \S+ rank (\d+) ([0-9.]+): (.*)$")
        for line in path.read_text().splitlines():
            m = pat.match(line)
            if m and float(m.group(2)) >= started - 1:
                out.append((float(m.group(2)), int(m.group(1)), m.group(3)))
    return sorted(out)


def down_nodes(job: str, nodes: list[str]) -> dict[str, str]:
    """node -> why Slurm says it is gone: a bad state, or its removal from
    the job's allocation (Slurm removes a failed node from a --no-kill job)."""
    down = {n: s for n in nodes if (s := node_bad_state(n))}
    now = job_nodes(job)
    for n in nodes:
        if now is not None and n not in now:
            down.setdefault(n, "removed from the job's allocation (node failure)")
    return down


def peer_addresses(errors: list[tuple[float, int, str]], nodes: list[str]) -> dict[str, set[str]]:
    """The names and addresses of ``nodes`` when an error names a peer
    (resolved only when an error names an address Slurm does not list); {}
    when none does."""
    named = named_peers(errors)
    if not named:
        return {}
    addresses = node_addresses(nodes, resolve=False)
    if any(not nodes_at(x[3], addresses) for x in named):
        addresses = node_addresses(nodes)
    return addresses


def gather(state: SupervisorState, a: Attempt, rc: int) -> Evidence:
    """The evidence of attempt ``a``, ended with srun's ``rc``."""
    hbs = attempt_heartbeats(state.run_dir, a.tag)
    errors = python_errors(state.run_dir, state.job, a.started)
    down = down_nodes(state.job, a.nodes)
    # Slurm's addresses only when the peer rule can apply (no hang, none
    # down, no rank's own error or strong signal first): asked as before.
    peer_rule = not a.hang and not down and errors and signalled_line(a.srun_errors, errors) is None
    return Evidence(
        job=state.job,
        attempt=a.tag,
        nodes=a.nodes,
        srun_exit=rc,
        started_at=a.started,
        job_kind=state.cfg.job.kind,
        now=time.time(),
        heartbeats=hbs,
        srun_errors=list(a.srun_errors),
        errors=errors,
        down=down,
        addresses=peer_addresses(errors, a.nodes) if peer_rule else {},
        hang=a.hang,
    )
