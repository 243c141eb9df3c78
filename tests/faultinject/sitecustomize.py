"""Test-only fault injection for the self-healing tests (tests/test_selfheal.py).

Put this directory on PYTHONPATH (the batch script keeps the submitter's
PYTHONPATH after the code dir): Python imports ``sitecustomize`` at start-up.
In a Slurm task (``SLURM_PROCID`` set) with ``MESHRUN_TEST_RAISE_AT_STEP=N``,
the training loop raises ``RuntimeError`` when it starts step N (its
heartbeat, ``train.heartbeat.beat("step", N)``), on every rank and every
attempt: a bug in the code, not a node. Nothing else is touched.
"""

import importlib.abc
import importlib.util
import os
import sys

_STEP = os.environ.get("MESHRUN_TEST_RAISE_AT_STEP", "")


class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "train.heartbeat":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        orig_exec = spec.loader.exec_module

        def exec_module(module):
            orig_exec(module)
            real = module.beat

            def beat(phase, step=0):
                if phase == "step" and step == int(_STEP):
                    raise RuntimeError(f"injected bug at step {step}")
                real(phase, step)

            module.beat = beat

        spec.loader.exec_module = exec_module
        return spec


if _STEP.isdigit() and "SLURM_PROCID" in os.environ:
    sys.meta_path.insert(0, _Patch())
