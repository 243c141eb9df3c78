"""``python -m launcher.image`` (``meshrun image``): build the Enroot image (.sqsh + digest) a run's tasks start from.
The command lives in :mod:`launcher.slurm.imagebuild`; this name is kept for scripts, docs and
rendered batch scripts."""

import sys

from launcher.slurm.imagebuild import main

if __name__ == "__main__":
    sys.exit(main())
