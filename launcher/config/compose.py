"""Compose a RunConfig from overrides outside ``@hydra.main`` (tests, CLIs)."""

from __future__ import annotations

import dataclasses
import re

from omegaconf import DictConfig, OmegaConf

from launcher.config.image_ref import resolve_image
from launcher.config.schema import RunConfig
from launcher.config.userconf import CONF_DIR
from launcher.config.validate import ConfigError


def to_run_config(cfg: DictConfig) -> RunConfig:
    """The typed RunConfig of a composed DictConfig (Hydra's own keys dropped).

    Converted group by group in place, not from a copy without ``hydra``:
    copying the whole tree was a quarter of a sweep point's cost
    (scripts/bench_sweep.py). Each group keeps its parent, so interpolations
    across groups resolve as before."""
    names = [f.name for f in dataclasses.fields(RunConfig)]
    extra = sorted(set(cfg.keys()) - {*names, "hydra"})
    if extra:  # a struct-typed root refuses these at composition already
        raise ConfigError(f"unknown top-level key(s) {extra}; valid: {names}")
    groups = {name: OmegaConf.to_object(cfg[name]) for name in names}
    assert all(dataclasses.is_dataclass(v) for v in groups.values()), groups
    obj = RunConfig(**groups)
    # Pyxis reads a relative image path as a registry image: make it absolute.
    obj.cluster.container_image = resolve_image(obj.cluster.container_image)
    return obj


def compose(overrides: list[str] | None = None) -> RunConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides, as the CLI would.

    Composition errors (unknown option, unknown key, wrong type) become
    :class:`ConfigError` with Hydra's message, which names the valid options.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from launcher.config.configstore import register
    from launcher.config.secrets import override_findings, refusal

    found = override_findings(list(overrides or []))
    if found:  # before Hydra, whose errors would repeat the value
        raise ConfigError(refusal(found[0]))
    register()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            cfg = hydra_compose(config_name="config", overrides=list(overrides or []))
        return to_run_config(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        from launcher.config.overrides import unknown_override  # it imports this module

        raise ConfigError(unknown_override(list(overrides or [])) or composition_message(e)) from e


LIST_OVERRIDE = re.compile(r"Error merging override ([\w.]+)=(.*?): Invalid value assigned")


def composition_message(e: BaseException) -> str:
    """Hydra's composition error (it names the valid options) and its cause, on one line."""
    # Hydra's search path is noise here; the valid options come before it.
    detail = str(e).strip().split("Config search path:")[0].strip()
    if e.__cause__ is not None:
        detail += f": {str(e.__cause__).strip().splitlines()[0]}"
    bad_list = LIST_OVERRIDE.search(detail)
    if bad_list and "is not a ListConfig" in detail:  # OmegaConf's words: say the field's shape
        key, value = bad_list.groups()
        return f"{key}={value!r} is invalid: a list, e.g. {key}=[--epochs,2] (each item one argument)"
    return " ".join(line.strip() for line in detail.splitlines() if line.strip())
