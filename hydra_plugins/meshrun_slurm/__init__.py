"""``hydra/launcher=meshrun_slurm``: any Hydra app's sweep as meshrun job=script runs (launcher.py)."""
