"""``python -m launcher.qos_admin`` (``meshrun qos-admin``): team QOS presets rendered for slurm.conf / sacctmgr.
The command lives in :mod:`launcher.slurm.qospresets`; this name is kept for scripts, docs and
rendered batch scripts."""

import sys

from launcher.slurm.qospresets import main

if __name__ == "__main__":
    sys.exit(main())
