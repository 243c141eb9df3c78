"""Ranks, the DeviceMesh, parallelisms applied in a fixed order (apply_* helpers), pipeline stages."""
