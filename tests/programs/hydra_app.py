"""A team's own Hydra app (tests/local/test_hydra_meshrun_slurm*.py,
tests/cluster/test_hydra_meshrun_slurm_cluster.py): its task
function writes a file into its job dir and returns a value. Switched onto
meshrun with one override: hydra/launcher=meshrun_slurm."""

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg: DictConfig) -> int:
    x = int(cfg.get("x", 1))
    if x == 0:  # a task function that raises (tests/local/test_hydra_meshrun_slurm.py)
        raise ZeroDivisionError("x=0: the app's own error")
    Path("answer.txt").write_text(f"{x * x}\n")  # the job dir (hydra.job.chdir=true)
    print(f"hydra app: x={x} rank={os.environ.get('RANK')} job dir {os.getcwd()}", flush=True)
    return x * x


if __name__ == "__main__":
    main()
