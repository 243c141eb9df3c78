"""Registers the schema with Hydra's ConfigStore (the only Hydra coupling)."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from launcher.schema import RunConfig


def register() -> None:
    """Make ``meshrun_schema`` available to ``conf/config.yaml``'s defaults.

    The root schema types every group (``cluster: ClusterConfig`` ...), so each
    YAML option is validated against its dataclass when merged: an unknown key
    or a wrongly typed value fails at composition.
    """
    ConfigStore.instance().store(name="meshrun_schema", node=RunConfig)
