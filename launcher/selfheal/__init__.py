"""Self-healing inside the allocation: the batch-level supervisor, hang watch, fault attribution, restart policy, stragglers, grow back, shrink choice."""
