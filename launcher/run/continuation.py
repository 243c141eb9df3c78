"""A run dir that holds a run continues that run: its saved config is the base,
what the user typed goes on top, and another program is refused.

``python -m launcher launcher.run_dir=DIR`` with no other override continues
the run in DIR with the config it was started with (config.yaml), whatever
the defaults say today; ``train.steps=N``, ``qos.time_limit_min=M`` and the
like change what they name. A change of the program (another job kind, or a
job=script run's script, module, arguments, interpreter, launch mode or
workdir) is refused before anything is written, naming the saved value and
the new one: that is a new run, in a new run dir. A change of the training
config (model, data, train) is :func:`launcher.run.rundir.check_resume`'s to
refuse, as before.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from launcher.config.runfiles import CONFIG_FILE
from launcher.config.schema import RunConfig
from launcher.config.validate import ConfigError

# What a run is: these job fields are its program (docs/your-code.md: continuing a run).
PROGRAM_FIELDS = ("kind", "script", "module", "args", "python", "launch", "workdir", "hf_path")


def typed_keys(overrides: list[str]) -> list[str]:
    """The dotted keys (``train.steps``) and whole groups (``model``) the user typed."""
    keys = []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if "=" in o and key and not key.startswith("hydra") and not key.startswith("-"):
            keys.append(key.split("@", 1)[0])
    return keys


def saved_config(run_dir: str | Path) -> dict[str, Any] | None:
    """The config a run dir's run was started with (None: no run there yet)."""
    path = Path(run_dir) / CONFIG_FILE
    try:
        if not path.is_file():
            return None
    except OSError:  # a path the filesystem cannot hold: prepare's check_run_dir says so
        return None
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(
            f"launcher.run_dir={str(run_dir)!r} is invalid: its {CONFIG_FILE} is unreadable ({e}); use a new run dir"
        ) from e
    if not isinstance(doc, dict):
        raise ConfigError(f"launcher.run_dir={str(run_dir)!r} is invalid: its {CONFIG_FILE} is not a mapping")
    return doc


def _program(job: dict[str, Any]) -> dict[str, Any]:
    return {k: job.get(k) for k in PROGRAM_FIELDS}


def check_program(run_dir: str | Path, saved: dict[str, Any], new: dict[str, Any]) -> None:
    """Refuse another program in a run dir that holds one (nothing written)."""
    old_p, new_p = _program(saved.get("job") or {}), _program(new.get("job") or {})
    changed = [f"job.{k}: {old_p[k]!r} -> {new_p[k]!r}" for k in PROGRAM_FIELDS if old_p[k] != new_p[k]]
    if changed:
        raise ConfigError(
            f"launcher.run_dir={str(run_dir)!r} holds a job={old_p['kind']} run of another program; "
            f"this is a new run, not its continuation. Changed: {'; '.join(changed)}. Continue it with "
            f"python -m launcher launcher.run_dir={run_dir} (its own config), or start the new run in a "
            "new run dir (drop launcher.run_dir)"
        )


def continued_config(cfg: RunConfig, run_dir: str | Path, typed: list[str]) -> RunConfig:
    """``cfg`` as composed, or, when ``run_dir`` holds a run, its saved config
    with the fields (or whole groups) the user typed taken from ``cfg``."""
    saved = saved_config(run_dir)
    if saved is None:
        return cfg
    new = dataclasses.asdict(cfg)
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in saved.items()}
    for key in typed_keys(typed):
        group, _, field = key.partition(".")
        if group not in new:
            continue
        if not field:
            merged[group] = new[group]  # a preset chosen: the whole group as composed
            continue
        head = field.split(".", 1)[0]  # cluster.env.X: the whole field
        merged.setdefault(group, {})[head] = new[group][head]
    merged.setdefault("launcher", {})["run_dir"] = cfg.launcher.run_dir
    check_program(run_dir, saved, merged)
    try:
        return _typed(merged)
    except (OmegaConfBaseException, TypeError, ValueError) as e:
        if cfg.launcher.resume == "force":  # resume anyway, as typed: the saved config is not used
            return cfg
        raise ConfigError(
            f"launcher.run_dir={str(run_dir)!r}: its {CONFIG_FILE} was written by another meshrun version "
            f"and cannot be read as today's config ({str(e).splitlines()[0]}); continue it with that "
            "version, start a new run in a new run dir, or resume it with this config: launcher.resume=force"
        ) from e


def _typed(doc: dict[str, Any]) -> RunConfig:
    from launcher.config.compose import to_run_config

    return to_run_config(OmegaConf.merge(OmegaConf.structured(RunConfig), doc))
