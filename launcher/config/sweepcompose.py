"""Fast composition of sweep points (``python -m launcher -m``).

Hydra composes every point of a sweep from scratch, twice (its sweeper
checks that each point composes, then the launcher composes it again): the
defaults list, every config file, the structured schema. That is ~0.15 s a
point on an idle host and grows linearly with the sweep. Most sweeps vary
values (``train.lr=a,b,c``), not config groups: points that choose the same
config groups start from the same composed config. This composes each
distinct choice of groups once and applies a point's value overrides to a
copy, exactly as Hydra does after composing (``_apply_overrides_to_config``),
and returns the config the sweeper just checked to the launcher instead of
composing it again. Anything else (``+``/``~``/``@`` overrides, ``hydra.*``
keys, group choices) goes through Hydra's own composition.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf


def _is_value_override(o: str) -> bool:
    """``a.b=v``: sets a value after composition (never picks a config file)."""
    key, sep, _ = o.partition("=")
    return (
        bool(sep)
        and "." in key
        and not key.startswith(("+", "~", "hydra."))
        and not any(c in key for c in "@/")
    )


class SweepComposer:
    """Stands in for ``config_loader.load_sweep_config``."""

    def __init__(self, slow: Callable[[DictConfig, list[str]], DictConfig]) -> None:
        self.slow = slow
        self.bases: dict[tuple[str, ...], DictConfig] = {}
        # Each base pickled once: unpickling a copy is about twice as fast as
        # deepcopy of the OmegaConf tree (most of a point's cost in a 500-point sweep).
        self.pickled: dict[tuple[str, ...], bytes | None] = {}
        # Parsed overrides by text: most of a point's overrides are shared
        # with the others, and Hydra's parser is slow (read, never changed).
        self.parsed: dict[str, Any] = {}
        self.checked: dict[tuple[str, ...], DictConfig] = {}

    def __call__(self, master_config: DictConfig, sweep_overrides: Sequence[str]) -> DictConfig:
        overrides = list(sweep_overrides)
        key = tuple(overrides)
        if key in self.checked:  # composed a moment ago by the sweeper's check
            return self.checked.pop(key)
        cfg = self._compose(master_config, overrides)
        # The sweeper's check only reads (and drops) its result: the launcher
        # gets the same object, untouched.
        self.checked[key] = cfg
        return cfg

    def _compose(self, master_config: DictConfig, overrides: list[str]) -> DictConfig:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
        from hydra.core.override_parser.overrides_parser import OverridesParser

        values = [o for o in overrides if _is_value_override(o)]
        groups = [o for o in overrides if not _is_value_override(o)]
        if not values:
            return self.slow(master_config, overrides)
        base_key = tuple(groups)
        if base_key not in self.bases:
            self.bases[base_key] = self.slow(master_config, groups)
            self.pickled[base_key] = _pickled(self.bases[base_key])
        blob = self.pickled[base_key]
        cfg = pickle.loads(blob) if blob is not None else copy.deepcopy(self.bases[base_key])
        new = [o for o in dict.fromkeys(overrides) if o not in self.parsed]
        if new:
            self.parsed.update(zip(new, OverridesParser.create().parse_overrides(new), strict=True))
        all_parsed = [self.parsed[o] for o in overrides]
        parsed = [o for o, text in zip(all_parsed, overrides, strict=True) if _is_value_override(text)]
        ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
        # What Hydra records about the point: its task overrides in order and
        # the override dirname made of them.
        cfg.hydra.overrides.task = [o.input_line for o in all_parsed]
        dirname_conf = cfg.hydra.job.config.override_dirname
        cfg.hydra.job.override_dirname = get_overrides_dirname(
            overrides=all_parsed,
            kv_sep=dirname_conf.kv_sep,
            item_sep=dirname_conf.item_sep,
            exclude_keys=dirname_conf.exclude_keys,
        )
        OmegaConf.copy_cache(from_config=master_config, to_config=cfg)
        return cfg


def _pickled(cfg: DictConfig) -> bytes | None:
    """``cfg`` as bytes to copy from; None (deepcopy instead) when something in it does not pickle."""
    try:
        return pickle.dumps(cfg)
    except (pickle.PicklingError, TypeError, AttributeError):
        return None


def install(config_loader: Any) -> None:
    """Route the loader's sweep composition through a SweepComposer (once)."""
    if not isinstance(config_loader.load_sweep_config, SweepComposer):
        config_loader.load_sweep_config = SweepComposer(config_loader.load_sweep_config)
