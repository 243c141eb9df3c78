"""Writes a run directory's launcher-side files: what every task (and a human) reads."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from launcher.container import record
from launcher.spec import RunSpec, save_spec


def write_run_dir(spec: RunSpec) -> None:
    """config.yaml (resolved config), plan.json, spec.json (the typed hand-off)
    and, with a container, container.json (image and content digest)."""
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(spec.cfg)))
    (run_dir / "plan.json").write_text(json.dumps(spec.plan.to_dict(), indent=2, default=str) + "\n")
    save_spec(spec)
    record(str(run_dir), spec.cfg.cluster.container_image)
