"""Hydra also composes from the user's config directory (presets written by
``meshrun init``; launcher/config/userconf.py), after meshrun's own conf/."""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from launcher.config.userconf import user_conf_dir


class MeshrunUserConf(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        path = user_conf_dir()
        if path.is_dir():
            search_path.append(provider="meshrun-user", path=f"file://{path}")
