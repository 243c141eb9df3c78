"""The program each meshrun task runs for a Hydra app's sweep point
(job=script: launcher/taskwrap/wrapper.py starts it, under meshrun's env,
signals and supervisor): ``python task.py <submission.pkl> <result.pkl>``.
Loads the pickled point (submitit's DelayedSubmission), runs it and, on rank
0, writes its result the way submitit does: ("success", value) or ("error",
traceback). An exception exits 1 (the supervisor's failure, restarted up to
launcher.max_restarts); a requeue or restart runs the function again."""

import os
import sys
import traceback
from pathlib import Path

# Run as a file, whose directory is not the app's (its config.py, point.py
# would shadow the app's modules of those names). The app's modules import
# from its working directory (job.workdir: where the app was started), as
# under submitit's `python -m`; the meshrun checkout this file is in (for
# hydra_plugins.meshrun_slurm.point, which the pickle names) goes last, so
# the app's own packages win.
HERE = Path(__file__).resolve()
sys.path[:] = [os.getcwd()] + [p for p in sys.path if Path(p or ".").resolve() != HERE.parent]
sys.path.append(str(HERE.parents[2]))

from hydra.core.utils import JobStatus  # noqa: E402
from submitit.core.utils import DelayedSubmission, cloudpickle_dump  # noqa: E402


def main(submission: str, result: str) -> int:
    rank0 = os.environ.get("RANK", "0") == "0"
    try:
        value = DelayedSubmission.load(submission).result()
    except Exception:  # the app's error: said, kept for the launcher, and a failed task
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        if rank0:
            cloudpickle_dump(("error", text), f"{result}.tmp")
            os.replace(f"{result}.tmp", result)
        return 1
    if rank0:
        tmp = f"{result}.tmp"
        cloudpickle_dump(("success", value), tmp)
        os.replace(tmp, result)  # whole or absent: the launcher polls for it
    # Hydra's run_job catches the task function's exception into a FAILED
    # JobReturn (the launcher returns it; Hydra raises it): to meshrun that
    # is the program's failure (failures.log, restarts), not a completed run.
    failed = getattr(value, "status", None) == JobStatus.FAILED
    if failed:
        err = value._return_value
        print("".join(traceback.format_exception(err)), file=sys.stderr, flush=True)
        return 1
    print("meshrun hydra point: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
