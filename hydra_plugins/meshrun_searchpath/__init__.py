"""The search path that adds the user's config dir (``meshrun init``'s presets) to Hydra's."""
