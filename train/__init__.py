"""meshrun trainer: what every Slurm task (or local rank) runs. Never imports Hydra."""
