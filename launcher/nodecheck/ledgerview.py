"""The bad-node ledger's view for admins: the ``scontrol ... State=DRAIN``
line for a node it excludes (``meshrun nodes``: launcher/commands/nodes.py)."""

from __future__ import annotations

from typing import Any

from launcher.config import nodeledger, nodename


def drain_command(node: str, recs: list[dict[str, Any]]) -> list[str]:
    """The admin's DRAIN line for ``node``: one checked node name (a range or
    a list from a shared ledger would drain many nodes), a printable reason."""
    if (why := nodename.problem(node)) is not None:
        raise ValueError(why)
    causes = ",".join(nodeledger.causes(recs))
    reason = (
        f"meshrun: {len(recs)} fault(s) ({causes}), last run {nodeledger.plain(recs[-1].get('run', '?'), 80)}"
    )
    return ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason[:200]}"]
