"""Registers the schema with Hydra's ConfigStore (the only Hydra coupling)."""

from __future__ import annotations

import secrets

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from launcher.config.schema import RunConfig


def register() -> None:
    """Make ``meshrun_schema`` available to ``conf/config.yaml``'s defaults.

    The root schema types every group (``cluster: ClusterConfig`` ...), so each
    YAML option is validated against its dataclass when merged: an unknown key
    or a wrongly typed value fails at composition.
    """
    ConfigStore.instance().store(name="meshrun_schema", node=RunConfig)
    # ${meshrun_suffix:} in conf/config.yaml's Hydra dirs: two runs (or
    # sweeps) started in the same second get different default run dirs.
    # Cached like Hydra's ${now:}, so one run resolves it to one value.
    if not OmegaConf.has_resolver("meshrun_suffix"):
        OmegaConf.register_new_resolver("meshrun_suffix", lambda: secrets.token_hex(2), use_cache=True)
