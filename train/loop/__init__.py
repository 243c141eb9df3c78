"""Assembling a trainer, one training step, the optimizer, checkpointed state and the stop flag.

Imports nothing here: ``python -m train`` installs the stop flag (signals.py) before torch loads."""
