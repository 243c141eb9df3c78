"""The batch script's in-allocation steps (launcher/slurm/render.py):

python -m launcher.selfheal RUN_DIR -- srun ...   # the supervisor around the training step
python -m launcher.selfheal job-end RUN_DIR RC    # goodput.json at the job's end
"""

import sys

from launcher.selfheal import supervisor
from launcher.views import goodputend

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["job-end"]:
        sys.exit(goodputend.main(args[1:]))
    sys.exit(supervisor.main(args))
