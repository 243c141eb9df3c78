"""Assembling a trainer, one training step, the optimizer, checkpointed state and the stop flag.

Imports nothing here: ``python -m train.loop.signals`` must install its flag before torch loads."""
