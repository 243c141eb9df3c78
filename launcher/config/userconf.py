"""The user's own config directory: presets ``meshrun init`` writes.

Laid out like ``conf/`` (``cluster/<name>.yaml``, ``qos/<name>.yaml``); every
composition also searches it, after the bundled ``conf/`` (so a bundled
preset is never shadowed), through the Hydra search-path plugin in
hydra_plugins/meshrun_searchpath. ``$MESHRUN_CONFIG_DIR`` names it; default
``$XDG_CONFIG_HOME/meshrun/conf`` (``~/.config/meshrun/conf``).
"""

from __future__ import annotations

import os
from pathlib import Path

# The bundled presets (conf/ of this checkout); launcher.config.compose re-exports it.
CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


CONFIG_DIR_ENV = "MESHRUN_CONFIG_DIR"


def user_conf_dir() -> Path:
    explicit = os.environ.get(CONFIG_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "meshrun" / "conf"
