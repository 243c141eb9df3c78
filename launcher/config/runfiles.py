"""The run directory's contract: every file and folder a run has, and every
exit code its tasks and batch script speak, named here and nowhere else.

A run directory is the source of truth of a run: what it is (its spec,
config, plan and code), how it went (results, metrics, faults, requeues,
goodput) and where its outputs are. The launcher writes some of its files,
the trainer, the task wrapper and the supervisor others; every view (status,
fleet, the page, goodput, the API, rerun, diff) reads them. Each name below
says who writes it; tests/unit/test_runfiles_contract.py fails when a module
spells a run-dir file name or an exit code itself instead of importing it
from here.

:class:`RunFiles` (submitit's ``JobPaths``, for a whole run) gives the paths
of one run directory. ``RUN_DIR_VERSION`` is written into ``spec.json``: a
run dir from an older meshrun is read or refused naming its version.
"""

from __future__ import annotations

from pathlib import Path

# Bumped when a file's meaning changes; spec.json carries it.
RUN_DIR_VERSION = 1

# --- what the run is (the launcher writes them before anything runs) --------
SPEC_FILE = "spec.json"  # RunSpec: config + plan, what every task loads (launcher/config/spec.py)
LEGACY_SPEC_FILE = "spec.pkl"  # a pickled spec from meshrun version 0: refused, named
CONFIG_FILE = "config.yaml"  # the composed config, for people (launcher/run/rundir.py)
PLAN_FILE = "plan.json"  # the plan, for people and tools (launcher/run/rundir.py)
RUN_ID_FILE = "run_id"  # the run's id, given at its first start (launcher/config/runid.py)
RECORD_FILE = "run_record.json"  # what repeats the run: code, packages, overrides (launcher/run/record.py)
PIPELINE_FILE = "pipeline.json"  # a pipeline dir's stages (launcher/commands/pipeline.py)
ATTEMPT_PLANS_DIR = "attempt_plans"  # the supervisor's shrunk plans, one per attempt
SLURM_DIR = "slurm"  # submitit's folder: the batch script, its logs, job.json
JOB_FILE = "job.json"  # in SLURM_DIR: the submitted job's id (launcher/slurm/submit.py)

# --- how it went (the tasks, the wrapper, the supervisor write them) --------
RESULT_FILE = "result.json"  # rank 0's last word: status, final step and loss
METRICS_FILE = "metrics.jsonl"  # one line per logged step, and the wrapper's events
FAILURES_FILE = "failures.log"  # a failing rank's (or wrapper's) one line
FAULTS_FILE = "faults.jsonl"  # the supervisor's fault records (launcher/config/health.py)
REQUEUES_FILE = "requeues.log"  # the batch script: "<job> <restart> <cause> <time>" per requeue
GOODPUT_FILE = "goodput.json"  # where the GPU-hours went (launcher/config/goodputfile.py)
CHECKPOINT_STATUS_FILE = "checkpoint_status.json"  # the newest committed checkpoint
STRAGGLERS_FILE = "stragglers.json"  # the straggler rule's verdicts
HEARTBEAT_DIR = "heartbeats"  # node-local heartbeats, one file per node
STACKS_DIR = "stacks"  # a hang's Python stacks, one file per rank and attempt
LOGS_DIR = "logs"  # local runs: logs/rank<N>.log
PROGRESS_DIR = "progress"  # job=script: each rank's progress file
PREFLIGHT_DIR = "preflight"  # preflight results per node, and the all-reduce's
ALLREDUCE_FILE = "allreduce.json"  # in PREFLIGHT_DIR: the short all-reduce over all tasks
CONTAINER_FILE = "container.json"  # the image a containerized run's tasks started from
EVAL_FILE = "eval.json"  # job=eval's results
COMPLETIONS_FILE = "completions.jsonl"  # job=generate's outputs
CHECKPOINT_DIR = "checkpoints"  # job=script: $MESHRUN_CHECKPOINT_DIR under the run dir
WORKDIR_DIR = "workdir"  # job=script: the run's own copy of the packed project

# --- a sweep dir ---------------------------------------------------------------
MANIFEST_FILE = "manifest.json"  # every point: overrides, status, job id, run dir, reason

# --- exit codes a task and the batch script speak ------------------------------
REQUEUE_EXIT_CODE = 75  # EX_TEMPFAIL: stopped after a signal, checkpoint committed: requeue
UNCOMMITTED_EXIT_CODE = 76  # stopped after a signal, the final checkpoint did NOT commit
STOP_EXIT_CODES = (REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE)
USER_ERROR_EXIT_CODE = 2  # a refused input: one "meshrun: error:" line
SUBMISSION_EXIT_CODE = 3  # Slurm did not take the job


def log_name(rank: int) -> str:
    """A local rank's output file in LOGS_DIR."""
    return f"rank{rank}.log"


class RunFiles:
    """The paths of one run directory."""

    __slots__ = ("run_dir",)

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)

    def __truediv__(self, name: str) -> Path:
        return self.run_dir / name

    @property
    def spec(self) -> Path:
        return self.run_dir / SPEC_FILE

    @property
    def config(self) -> Path:
        return self.run_dir / CONFIG_FILE

    @property
    def plan(self) -> Path:
        return self.run_dir / PLAN_FILE

    @property
    def record(self) -> Path:
        return self.run_dir / RECORD_FILE

    @property
    def result(self) -> Path:
        return self.run_dir / RESULT_FILE

    @property
    def metrics(self) -> Path:
        return self.run_dir / METRICS_FILE

    @property
    def failures(self) -> Path:
        return self.run_dir / FAILURES_FILE

    @property
    def faults(self) -> Path:
        return self.run_dir / FAULTS_FILE

    @property
    def requeues(self) -> Path:
        return self.run_dir / REQUEUES_FILE

    @property
    def goodput(self) -> Path:
        return self.run_dir / GOODPUT_FILE

    @property
    def slurm(self) -> Path:
        return self.run_dir / SLURM_DIR

    @property
    def job(self) -> Path:
        return self.run_dir / SLURM_DIR / JOB_FILE

    def log(self, rank: int) -> Path:
        return self.run_dir / LOGS_DIR / log_name(rank)
