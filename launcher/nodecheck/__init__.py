"""Node checks: preflight on every node, host probes, the bad-node ledger's view."""
