"""Writes a run directory's launcher-side files: what every task (and a human) reads."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import yaml

from launcher.config.runfiles import CONFIG_FILE, PLAN_FILE, RESULT_FILE
from launcher.config.runid import read_run_id, what_runs
from launcher.config.schema import ResumeMode, RunConfig
from launcher.config.spec import RunSpec, save_spec, training_config
from launcher.config.validate import ConfigError, fail
from launcher.slurm.container import record

_SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def write_run_dir(spec: RunSpec) -> None:
    """config.yaml (resolved config), plan.json, spec.json (the typed hand-off;
    saving it gives a new run its id, launcher/config/runid.py) and, with a
    container, container.json (image and content digest)."""
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # The same text OmegaConf.to_yaml(OmegaConf.structured(cfg)) gives, without
    # building an OmegaConf tree (a tenth of the time; sweeps write one per
    # point), emitted by libyaml where PyYAML has it (the same text, 5x faster).
    text = yaml.dump(dataclasses.asdict(spec.cfg), Dumper=_SAFE_DUMPER, sort_keys=False)
    (run_dir / CONFIG_FILE).write_text(text)
    (run_dir / PLAN_FILE).write_text(json.dumps(spec.plan.to_dict(), indent=2, default=str) + "\n")
    save_spec(spec)
    record(str(run_dir), spec.cfg.cluster.container_image)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted keys (``train.lr``)."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for every field of the training config (what the
    checkpoint's config hash covers) that differs."""
    a, b = flatten(training_config(old)), flatten(training_config(new))
    missing = object()
    return [
        f"{k}: {a.get(k, '(unset)')!r} -> {b.get(k, '(unset)')!r}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k, missing) != b.get(k, missing)
    ]


def check_resume(spec: RunSpec) -> None:
    """A reused run directory resumes its own run; refuse it when the
    training config changed since its last start, unless
    ``launcher.resume=force``. Writes nothing (a refusal leaves no trace)."""
    run_dir = Path(spec.run_dir)
    previous = run_dir / CONFIG_FILE
    if not previous.is_file():
        return  # a new run
    try:
        old = yaml.safe_load(previous.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(
            f"launcher.run_dir={str(run_dir)!r} is invalid: its {CONFIG_FILE} is unreadable ({e}); "
            "use a new run dir"
        ) from e
    changes = config_changes(old, dataclasses.asdict(spec.cfg))
    if not changes or spec.cfg.launcher.resume == "force":
        return
    run_id = read_run_id(run_dir) or run_dir.name
    raise ConfigError(
        f"launcher.run_dir={str(run_dir)!r} holds run {run_id}, trained with another configuration; "
        f"resuming it would load its checkpoints into a changed run. Changed: {'; '.join(changes)}. "
        "Start a new run in a new run dir, or resume anyway with launcher.resume=force "
        f"(launcher.resume: choose one of {', '.join(ResumeMode.__args__)})"
    )


def finished_message(spec: RunSpec) -> str | None:
    """A training run dir whose last start completed every step asked for
    now: the message that says so and how to train further (None: there is
    work to do). Starting ranks would only load the checkpoint and exit."""
    if spec.cfg.job.kind not in ("pretrain", "finetune"):
        return None  # eval and generate decide what is left themselves
    try:
        result = json.loads((Path(spec.run_dir) / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(result, dict) or result.get("status") != "completed":
        return None
    final = result.get("final_step")
    steps = spec.cfg.train.steps
    if not isinstance(final, int) or final < steps:
        return None
    run_id = read_run_id(spec.run_dir) or spec.run_dir
    return (
        f"run {run_id} already completed: final step {final} of train.steps={steps}; nothing was started. "
        f"To train further, raise train.steps: python -m launcher launcher.run_dir={spec.run_dir} "
        f"train.steps={max(final, steps) * 2}"
    )


# What runs write below the run dir, at most (checkpoints/step_<N>/__<rank>_<i>.distcp,
# slurm/<job>_<array>_<task>_log.out, preflight results per node, ...).
DEEPEST_BELOW = 120


def check_run_dir(run_dir: str) -> None:
    """Refuse a run dir the filesystem cannot hold (a name over NAME_MAX, a
    path over PATH_MAX with room for the files below it), before anything is
    written; the message names launcher.run_dir, not an OSError."""
    path = Path(os.path.abspath(run_dir))
    probe = path
    while not _exists(probe) and probe != probe.parent:
        probe = probe.parent
    try:
        name_max = os.pathconf(probe, "PC_NAME_MAX")
        path_max = os.pathconf(probe, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise fail(
                "launcher.run_dir",
                _short(run_dir),
                f"the name {_short(part)!r} is {len(os.fsencode(part))} bytes; this filesystem allows {name_max}",
            )
    room = path_max - 1 - DEEPEST_BELOW
    if len(os.fsencode(str(path))) > room:
        raise fail(
            "launcher.run_dir",
            _short(run_dir),
            f"the path is {len(os.fsencode(str(path)))} bytes; at most {room} leave room for the files "
            f"a run writes below it (PATH_MAX {path_max}); choose a shorter launcher.run_dir",
        )
    if not probe.is_dir():
        raise fail("launcher.run_dir", run_dir, f"{probe} is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise fail("launcher.run_dir", run_dir, f"{probe} is not writable by this user")


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # ENAMETOOLONG, ELOOP, EACCES: reported by the checks that follow
        return False


def _short(text: str, keep: int = 60) -> str:
    return text if len(text) <= 2 * keep else f"{text[:keep]}...{text[-keep:]}"


def default_run_dir(cfg: RunConfig) -> str:
    """``<launcher.runs_root>/<model>-<cluster>/<time>-<random>`` (runs_root
    ``runs`` under the current directory by default),
    for a run without launcher.run_dir (two runs started in the same second
    get two dirs). Chosen here, not as Hydra's run dir: Hydra makes its run
    dir before the config is checked, and a refused run must leave no
    directory behind."""
    stamp = f"{time.strftime('%Y-%m-%d_%H-%M-%S')}-{secrets.token_hex(2)}"
    return os.path.join(cfg.launcher.runs_root, f"{what_runs(cfg)}-{cfg.cluster.name}", stamp)
