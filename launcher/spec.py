"""RunSpec: the typed hand-off from the launcher to every training task.

Written once per run as ``<run_dir>/spec.pkl`` (plus human-readable
``config.yaml`` and ``plan.json``); a task loads it with :func:`load_spec`.
Standard library only, so ``train`` can read it without Hydra.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

from launcher.plan import Plan
from launcher.schema import RunConfig

SPEC_FILE = "spec.pkl"


@dataclass
class RunSpec:
    cfg: RunConfig
    plan: Plan
    run_dir: str

    @property
    def checkpoint_dir(self) -> str:
        """Tier-1 checkpoint directory (node-local NVMe on clusters)."""
        return self.cfg.storage.local_dir or os.path.join(self.run_dir, "checkpoints")

    @property
    def metrics_path(self) -> str:
        return os.path.join(self.run_dir, "metrics.jsonl")

    def config_hash(self) -> str:
        """Hash of what the training computes: model, data, optimisation. Not
        the layout (a checkpoint reloads at other dp/tp degrees), nor where
        or how long it runs."""
        keep = {k: dataclasses.asdict(getattr(self.cfg, k)) for k in ("model", "data")}
        keep["train"] = {k: v for k, v in dataclasses.asdict(self.cfg.train).items() if k != "steps"}
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def save_spec(spec: RunSpec) -> Path:
    path = Path(spec.run_dir) / SPEC_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(spec, f)
    os.replace(tmp, path)  # atomic: a task never reads half a spec
    return path


def load_spec(run_dir: str | os.PathLike[str]) -> RunSpec:
    with open(Path(run_dir) / SPEC_FILE, "rb") as f:
        spec = pickle.load(f)
    assert isinstance(spec, RunSpec), type(spec)
    return spec
