"""Self-healing inside the allocation: the batch-level supervisor, hang watch, fault attribution, restart policy, stragglers, grow back, shrink choice.

One module per mechanism, plain objects the supervisor composes around one
shared state (state.py); no class here inherits another project class
(scripts/import_graph.py checks it)."""
