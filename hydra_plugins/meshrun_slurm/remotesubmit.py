"""``python -m hydra_plugins.meshrun_slurm.remotesubmit SWEEP_DIR`` on a
cluster's login node: the submission half of a Hydra app's sweep sent over
SSH (overssh.py). The tar on stdin (each point's pickle and points.json)
goes into ``<SWEEP_DIR>/.meshrun_slurm``; each point's meshrun overrides are
composed and checked again here, then one job array (launcher.py's
``submit_points``: the sweep launcher's submission, the manifest); the job
ids on one line. A refusal is one ``meshrun: error:`` line and removes what
this wrote (the pickles; the sweep dir when it made it)."""

import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

from hydra_plugins.meshrun_slurm.overssh import BUNDLE, SUBMITTED


def main(argv: list[str]) -> int:
    """On the login node: the tar on stdin into ``<SWEEP_DIR>/.meshrun_slurm``,
    each point composed and checked, one job array; the job ids on one line.
    A refusal: one ``meshrun: error:`` line and nothing of this left."""
    from hydra_plugins.meshrun_slurm.launcher import submit_points
    from launcher.config.compose import compose
    from launcher.config.validate import ConfigError
    from launcher.run.prepare import prepare
    from launcher.slurm.cluster import SlurmError

    sweep_dir = Path(argv[0])
    made = [d for d in (sweep_dir, *sweep_dir.parents) if not d.exists()]
    folder = sweep_dir / ".meshrun_slurm"
    try:
        folder.mkdir(parents=True, mode=0o700)
        with tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read()), mode="r") as tar:
            tar.extractall(folder, filter="data")
        rows = json.loads((folder / BUNDLE).read_text())
        specs = {n: prepare(compose(row["meshrun"]), row["run_dir"]) for n, row in enumerate(rows["points"])}
        overrides = [row["overrides"] for row in rows["points"]]
        ids = submit_points(specs, overrides, sweep_dir, rows["extra"])
    except (ConfigError, SlurmError, OSError, ValueError, KeyError) as e:
        print(f"meshrun: error: {e}", file=sys.stderr, flush=True)
        # What this made: the pickles, and the sweep dir (manifest, slurm/) when it made it.
        shutil.rmtree(sweep_dir if sweep_dir in made else folder, ignore_errors=True)
        for d in made[1:]:  # its parents this made, innermost first, once empty
            try:
                d.rmdir()
            except OSError:
                break
        return 2 if isinstance(e, ConfigError) else 1
    print(SUBMITTED + json.dumps(ids), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
