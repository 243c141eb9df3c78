"""Rewrite tests/golden/sbatch_<cluster>.sh for every Slurm cluster preset.

    python scripts/regen_golden.py          # rewrite, then review `git diff tests/golden`
    python scripts/regen_golden.py --check  # exit 1 if any golden file is stale

Each preset is rendered with ``model=13b`` and fixed paths (run dir, python,
code dir) so the files are byte-stable across machines. Presets with Pyxis get
a container image, so their golden scripts carry the Pyxis flags.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN_DIR = ROOT / "tests" / "golden"
MODEL = "13b"
IMAGE = "nvcr.io#nvidia/pytorch:25.03-py3"
RUN_DIR = "/shared/runs/golden"
PYTHON = "python3"
CODE_DIR = "/opt/meshrun"


def slurm_presets() -> list[str]:
    import yaml

    names = []
    for path in sorted((ROOT / "conf" / "cluster").glob("*.yaml")):
        if yaml.safe_load(path.read_text()).get("kind") == "slurm":
            names.append(path.stem)
    return names


def render_golden(cluster: str) -> str:
    from launcher.config import ncclenv as nccl
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.slurm.render import render_sbatch

    overrides = [f"cluster={cluster}", f"model={MODEL}"]
    if compose(overrides).cluster.pyxis:
        overrides.append(f"cluster.container_image='{IMAGE}'")
    cfg = compose(overrides)
    nccl.apply(cfg.cluster)  # as `python -m launcher` does before rendering
    run_dir = f"{RUN_DIR}/{cluster}"
    spec = RunSpec(cfg, make_plan(cfg), run_dir)
    return render_sbatch(spec, f"{run_dir}/slurm", python=PYTHON, code_dir=CODE_DIR)


def render_array_golden() -> str:
    """A two-point sweep on the 4node preset with a container: one job array
    whose tasks each train (and mount) their own point's run dir."""
    from launcher.config import ncclenv as nccl
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.slurm.render import render_array_sbatch

    sweep = f"{RUN_DIR}/sweep"
    specs = []
    for i, lr in enumerate(("0.001", "0.002")):
        cfg = compose(
            ["cluster=4node", f"model={MODEL}", f"cluster.container_image='{IMAGE}'", f"train.lr={lr}"]
        )
        nccl.apply(cfg.cluster)
        specs.append(RunSpec(cfg, make_plan(cfg), f"{sweep}/{i}"))
    return render_array_sbatch(specs, f"{sweep}/slurm", python=PYTHON, code_dir=CODE_DIR)


def goldens() -> dict[str, str]:
    """File name -> rendered script, for every golden file."""
    out = {f"sbatch_{cluster}.sh": render_golden(cluster) for cluster in slurm_presets()}
    out["sbatch_array_4node.sh"] = render_array_golden()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    stale = []
    for name, text in goldens().items():
        path = GOLDEN_DIR / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print("stale golden files (run python scripts/regen_golden.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
