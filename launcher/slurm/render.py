"""The sbatch script of a run, exactly as :mod:`launcher.slurm.submit` hands it to
submitit: built with submitit's own ``_make_sbatch_string`` from the Plan.

Pure string work (no Slurm, no torch): the dry run renders ``cluster=4node``
on a laptop, and the output is deterministic for a fixed folder, python and
code directory (``tests/golden/``).

What the script does beyond submitit's defaults:
- exports the cluster's NCCL preset and the rendezvous address (the first
  node of the allocation) and port (derived from the job id);
- runs ``python -m train <run_dir>`` (job=script: launcher/taskwrap/wrapper.py)
  in every task, inside a Pyxis container when ``cluster.container_image`` is set;
- requeues from the batch level when the tasks exit with
  ``REQUEUE_EXIT_CODE`` (launcher/config/runfiles.py) (they checkpointed after USR2 or
  SIGTERM) or ``UNCOMMITTED_EXIT_CODE`` (they stopped after the signal but
  the final checkpoint did not commit: said in the job's log, and the requeued
  job resumes from the newest committed step), so it works in containers without ``scontrol``, but only when
  Slurm's own view of the job says it is still running (preempted: a
  PreemptTime; otherwise near its time limit); a cancelled job is not
  requeued. Each requeue is written to ``<run_dir>/requeues.log`` with its
  cause, so reruns after failures (``SLURM_RESTART_COUNT`` minus those) are
  counted apart and only they are limited by ``launcher.max_restarts``;
- runs the tasks with ``srun --kill-on-bad-exit=1``: when any rank dies the
  step ends instead of idling on allocated GPUs, and the job's log names the
  first failing rank (``<run_dir>/failures.log``);
- for training runs (job.kind pretrain/finetune/script, not job arrays), runs that
  srun under the batch-level supervisor (launcher/selfheal/supervisor.py): hang
  detection from the ranks' heartbeats, failure attribution
  (``<run_dir>/faults.jsonl``, the bad-node ledger), restarts inside the
  allocation without the bad node (``cluster.spare_nodes`` extra nodes are
  allocated for this; ``--no-kill`` keeps the allocation when a node fails),
  and a requeue excluding it when too few nodes are left.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher.config.runfiles import FAILURES_FILE, REQUEUE_EXIT_CODE, REQUEUES_FILE, UNCOMMITTED_EXIT_CODE
from launcher.config.scriptjob import PROJECT_DIR_ENV
from launcher.config.spec import RunSpec
from launcher.config.validate import fail, s3_credentials_file
from launcher.slurm.container import container_name
from launcher.slurm.resources import cpus_per_task, node_mem_gb, task_count

CODE_DIR = str(Path(__file__).resolve().parents[2])
PORT_BASE, PORT_SPAN = 20000, 20000  # MASTER_PORT = base + job id % span
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Written by the batch script, one line per requeue it asks for:
# "<job id> <SLURM_RESTART_COUNT> preemption|time_limit <unix time>".


def script_strings(spec: RunSpec, folder: str) -> list[tuple[str, str]]:
    """(field, value) of every user string that reaches the sbatch script."""
    cfg = spec.cfg
    c, q = cfg.cluster, cfg.qos
    out = [
        ("launcher.job_name", cfg.launcher.job_name),
        # Read back from <run_dir>/run_id on a resume: a file anyone with
        # write access to the run dir could have edited.
        (f"the run id in {spec.run_dir}/run_id", spec.run_id),
        ("qos.partition", q.partition),
        ("qos.qos", q.qos),
        ("qos.account", q.account),
        ("launcher.run_dir", spec.run_dir),
        ("launcher.run_dir", folder),  # the job folder lies in the run (or sweep) dir
        ("cluster.container_image", c.container_image),
        ("cluster.container_workdir", c.container_workdir),
        ("cluster.container_python", c.container_python),
    ]
    out += [(f"cluster.container_mounts[{i}]", m) for i, m in enumerate(c.container_mounts)]
    out += [(f"cluster.env.{k}", str(v)) for k, v in c.env.items()]
    return out


def check_script_strings(spec: RunSpec, folder: str) -> None:
    """The one rendering rule: every value is shlex-quoted where it lands
    (submitit quotes ``#SBATCH`` values and the srun line; setup lines quote
    their own), and no value may span lines: a newline in an ``#SBATCH``
    value would end the comment and leave the rest for the batch shell."""
    for field, value in script_strings(spec, folder):
        if CONTROL.search(value):
            raise fail(field, value, "must not contain control characters (newline, tab, escape, NUL)")


def signal_lead_s(spec: RunSpec) -> int:
    """The planned USR2 lead (launcher/plan/stopping.py), or the configured one."""
    return spec.plan.signal_lead_s or spec.cfg.launcher.signal_lead_s


def sbatch_parameters(spec: RunSpec) -> dict[str, Any]:
    """Resource parameters for submitit's ``_make_sbatch_string`` (its names)."""
    cfg, plan = spec.cfg, spec.plan
    q, launcher = cfg.qos, cfg.launcher
    lead = signal_lead_s(spec)
    if lead >= q.time_limit_min * 60:
        # Slurm would signal at once, before the tasks can install a handler.
        raise fail(
            "launcher.signal_lead_s",
            f"{lead} (planned)" if not launcher.signal_lead_s else lead,
            f"must be shorter than the time limit (qos.time_limit_min={q.time_limit_min} = "
            f"{q.time_limit_min * 60} s)",
        )
    params: dict[str, Any] = {
        # The name typed (free text, quoted by submitit), else the run id (none
        # yet before a spec's first save: golden files).
        "job_name": launcher.job_name or spec.run_id or "meshrun",
        "nodes": plan.nodes,
        "ntasks_per_node": task_count(spec),  # one task per GPU
        "gpus_per_node": cfg.cluster.gpus_per_node or None,  # CPU work: no GPU option at all
        "cpus_per_task": cpus_per_task(spec),
        "mem": f"{node_mem_gb(spec)}GB",
        "time": q.time_limit_min,
        "partition": q.partition,
        "qos": q.qos,
        "account": q.account,
        # Slurm's own USR2 lead time before the limit (and at preemption).
        "signal_delay_s": lead,
        "wckey": "meshrun",
        "comment": f"meshrun run_dir={spec.run_dir}",
        "additional_parameters": {"requeue": True},
    }
    if launcher.exclusive:
        params["exclusive"] = True
    if launcher.hold:
        params["additional_parameters"]["hold"] = True
    return params


def supervised(spec: RunSpec) -> bool:
    """Training runs on Slurm run their srun under launcher/selfheal/supervisor.py."""
    return spec.cfg.cluster.kind == "slurm" and spec.cfg.job.kind in ("pretrain", "finetune", "script")


def supervised_command(
    spec: RunSpec,
    folder: str,
    command: str,
    srun_flags: Sequence[str],
    *,
    code_dir: str | None = None,
    python: str | None = None,
) -> str:
    """The batch script's command for a supervised run: the supervisor, on the
    batch host with the submitting interpreter (``python`` when given) and
    the code dir on its path, running submitit's srun line; the plain srun
    line when that interpreter cannot import it there (said in the log)."""
    from submitit.core.utils import JobPaths

    paths = JobPaths(folder=folder)
    srun = shlex.join(
        [
            "srun",
            "--unbuffered",
            "--open-mode=append",
            "--output",
            str(paths.stdout),
            "--error",
            str(paths.stderr),
            *srun_flags,
        ]
    )
    py = python or shlex.quote(sys.executable)
    env = f"PYTHONPATH={shlex.quote(code_dir or CODE_DIR)}"
    return "\n".join(
        [
            f"if {env} {py} -c 'import launcher.selfheal' 2>/dev/null; then",
            # The tasks get the batch's own PYTHONPATH back (the supervisor's is the host code dir).
            f'  MESHRUN_TASK_PYTHONPATH="${{PYTHONPATH:-}}" {env} {py} -u -m launcher.selfheal '
            f'"$MESHRUN_RUN_DIR" -- {srun} {command}',
            "else",
            '  echo "meshrun: no supervisor on the batch host: one srun, no restart inside the allocation" >&2',
            f"  {srun} {command}",
            "fi",
        ]
    )


def _mounts(
    spec: RunSpec, folder: str, code_dir: str, run_dirs: Sequence[str] = (), project_dir: str | None = None
) -> list[str]:
    """Host paths bound into the container, each at the same path inside, so
    spec paths, logs and checkpoints resolve identically on both sides: the
    code (at the workdir), the run dir(s), the job folder, then the cluster's
    own ``container_mounts``. A job array passes every point's run dir in
    ``run_dirs``: each array task must see its own."""
    c = spec.cfg.cluster
    workdir = c.container_workdir or "/workspace/meshrun"
    mounts = [f"{code_dir}:{workdir}"]
    sources: list[str] = []
    # job=script: its project dir (the packed copy, else job.workdir) too.
    project = [project_dir or spec.cfg.job.workdir] if spec.cfg.job.kind == "script" else []
    for path in [*(run_dirs or [spec.run_dir]), folder, *project]:
        if not any(path == s or path.startswith(s.rstrip("/") + "/") for s in sources):
            # A parent mounted later covers its children mounted earlier.
            sources = [s for s in sources if not s.startswith(path.rstrip("/") + "/")] + [path]
    mounts += [f"{s}:{s}" for s in sources]
    mounts += [m for m in c.container_mounts if m not in mounts]
    creds = s3_credentials_file(spec.cfg)
    if creds:  # home is not mounted (--no-container-mount-home): the file is, read-only
        mounts.append(f"{creds}:{creds}:ro")
    return mounts


def array_mount_dirs(run_dirs: Sequence[str], folder: str) -> list[str]:
    """What a job array mounts: its sweep folder's parent (the sweep root)
    when every point's run dir lies under it, which keeps the script one
    line whatever the number of points; otherwise every run dir."""
    root = str(Path(folder).parent)
    if all(d.startswith(root.rstrip("/") + "/") for d in run_dirs) and root != "/":
        return [root]
    return list(run_dirs)


def srun_args(
    spec: RunSpec, folder: str, code_dir: str, run_dirs: Sequence[str] = (), project_dir: str | None = None
) -> list[str]:
    """Extra srun flags: fail fast, and Pyxis container flags when a
    container image is set.
    Every step of a job names the same container, so the steps after the
    first (preflight, all-reduce, training) reuse the unpacked image, each
    in a container of its own (``:no_exec``)."""
    c = spec.cfg.cluster
    # One rank dying ends the step (the others get SIGTERM, then SIGKILL
    # after KillWait): a job never idles on its GPUs waiting for a dead peer.
    args: list[str] = ["--kill-on-bad-exit=1"]
    if c.container_image:
        args += [
            f"--container-image={c.container_image}",
            # no_exec: a step beside a running one (in-process recovery's store
            # host, warm spares and replacements) starts its own container on the
            # unpacked filesystem, with its mounts, instead of attaching to the
            # running container's namespaces, which ignores --container-mounts
            # (pyxis: "ignoring --container-mounts when attaching to a running
            # container"; the test image's /usr is a mount).
            f"--container-name={container_name(c.container_image)}:no_exec",
            f"--container-mounts={','.join(_mounts(spec, folder, code_dir, run_dirs, project_dir))}",
            f"--container-workdir={c.container_workdir or '/workspace/meshrun'}",
            "--no-container-mount-home",
        ]
    return args


def setup_lines(spec: RunSpec, code_dir: str, run_dir_expr: str | None = None) -> list[str]:
    """Batch-level environment exported to every task (srun --export=ALL;
    Pyxis passes it into the container)."""
    cfg, plan = spec.cfg, spec.plan
    c = cfg.cluster
    code_in_task = (c.container_workdir or "/workspace/meshrun") if c.container_image else code_dir
    lines: list[str] = []
    for key in sorted(c.env):
        if not ENV_NAME.match(str(key)):  # a name cannot be quoted: refuse its shape
            raise fail(
                "cluster.env",
                str(key),
                "environment names are letters, digits and '_', not starting with a digit",
            )
        lines.append(f"export {key}={shlex.quote(str(c.env[key]))}")
    if s3_credentials_file(cfg):  # the job's S3 keys: a file, never the environment (docs/security.md)
        lines.append(f"export AWS_SHARED_CREDENTIALS_FILE={shlex.quote(s3_credentials_file(cfg))}")
    lines += [
        f"export PYTHONPATH={shlex.quote(code_in_task)}${{PYTHONPATH:+:$PYTHONPATH}}",
        # `python -m` would put the job's working directory (often the
        # checkout) before PYTHONPATH: the code dir (a snapshot) must win.
        "export PYTHONSAFEPATH=1",
        "export PYTHONUNBUFFERED=1",
        f"export MESHRUN_RUN_DIR={run_dir_expr or shlex.quote(spec.run_dir)}",
        # Rendezvous on the allocation's first node, by the address Slurm
        # reaches it at (NodeAddr), falling back to its name.
        'MESHRUN_HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'MASTER_ADDR=$(scontrol -o show node "$MESHRUN_HEAD" | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p")',
        'export MASTER_ADDR="${MASTER_ADDR:-$MESHRUN_HEAD}"',
    ]
    if cfg.launcher.master_port:
        lines.append(f"export MASTER_PORT={cfg.launcher.master_port}")
    else:
        # Distinct per job (and per array task): concurrent jobs sharing a
        # head node do not collide.
        lines.append(f"export MASTER_PORT=$(( {PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN} ))")
    if plan.device == "cpu" and "OMP_NUM_THREADS" not in c.env:
        # CPU ranks share the node's cores: one BLAS thread each.
        lines.append(f"export OMP_NUM_THREADS={max(1, cpus_per_task(spec))}")
    lines += requeue_count_lines(spec)
    lines.append(
        'echo "meshrun: job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} '
        "(preemptions $MESHRUN_PREEMPT_REQUEUES, time limits $MESHRUN_TIME_LIMIT_REQUEUES, "
        'failures $MESHRUN_FAILURE_RESTARTS) on $SLURM_JOB_NODELIST rendezvous $MASTER_ADDR:$MASTER_PORT"'
    )
    return lines


def requeue_count_lines(spec: RunSpec) -> list[str]:
    """Count this job's requeues by cause; stop when reruns after failures
    exceed ``launcher.max_restarts``. Also: keep the batch shell alive through
    a SIGTERM (scancel) so the teardown can ask Slurm what happened, and
    tell the tasks Slurm's KillWait (their time after a SIGTERM)."""
    max_restarts = spec.cfg.launcher.max_restarts
    ledger = f'"$MESHRUN_RUN_DIR/{REQUEUES_FILE}"'
    count = 'grep -sc "^$SLURM_JOB_ID [0-9]* {cause} " ' + ledger + " || true"
    return [
        "trap 'MESHRUN_GOT_TERM=1' TERM",
        "export MESHRUN_KILL_WAIT_S=$(scontrol show config 2>/dev/null | "
        "sed -n 's/^KillWait *= *\\([0-9]*\\).*/\\1/p')",
        f"MESHRUN_PREEMPT_REQUEUES=$({count.format(cause='preemption')})",
        f"MESHRUN_TIME_LIMIT_REQUEUES=$({count.format(cause='time_limit')})",
        "export MESHRUN_PREEMPT_REQUEUES=${MESHRUN_PREEMPT_REQUEUES:-0} "
        "MESHRUN_TIME_LIMIT_REQUEUES=${MESHRUN_TIME_LIMIT_REQUEUES:-0}",
        "export MESHRUN_FAILURE_RESTARTS=$(( ${SLURM_RESTART_COUNT:-0} - MESHRUN_PREEMPT_REQUEUES "
        "- MESHRUN_TIME_LIMIT_REQUEUES ))",
        f'if [ "$MESHRUN_FAILURE_RESTARTS" -gt {max_restarts} ]; then',
        '  echo "meshrun: giving up: job $SLURM_JOB_ID was restarted $MESHRUN_FAILURE_RESTARTS times after '
        f'failures (launcher.max_restarts={max_restarts}; preemption and time-limit requeues do not count)" >&2',
        "  exit 1",
        "fi",
    ]


def preflight_lines(
    spec: RunSpec, folder: str, code_dir: str, python: str | None = None, run_dirs: Sequence[str] = ()
) -> list[str]:
    """Preflight before training, on every node (launcher/preflight.py: GPUs,
    NVLink, InfiniBand, scratch, RAM, S3; every node runs to the end), then a
    short all-reduce over all tasks (train/observe/preflight_comm.py). A failing node
    is recorded as a fault (``preflight --record`` on the batch host:
    faults.jsonl, the bad-node ledger); when the other nodes are enough
    (``cluster.spare_nodes``) the all-reduce and the training run without it
    (the supervisor reads the fault), else the job ends before any GPU-hour
    is spent on training, naming the node. A requeued job checks again (a
    node may have gone bad)."""
    if not spec.cfg.cluster.preflight:
        return []
    py = _python(spec, python)
    host_py = f"PYTHONPATH={shlex.quote(code_dir or CODE_DIR)} {python or shlex.quote(sys.executable)}"
    args = srun_args(spec, folder, code_dir, run_dirs)
    srun = shlex.join(["srun", *args])
    # The node checks run to the end on every node: one failing ends no other.
    node_srun = shlex.join(
        ["srun", *("--kill-on-bad-exit=0" if a == "--kill-on-bad-exit=1" else a for a in args)]
    )
    fail = 'echo "meshrun: preflight failed: training not started (see above)" >&2; exit 1'
    return [
        "MESHRUN_PREFLIGHT_SRUN=",
        f'if ! {node_srun} --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 {py} -u -m launcher.preflight --node "$MESHRUN_RUN_DIR"; then',
        f'  MESHRUN_PREFLIGHT_SRUN=$({host_py} -m launcher.preflight --record "$MESHRUN_RUN_DIR") || {{ {fail}; }}',
        "fi",
        f'{srun} $MESHRUN_PREFLIGHT_SRUN {py} -u -m train.observe.preflight_comm "$MESHRUN_RUN_DIR" || {{ {fail}; }}',
    ]


def teardown_lines(spec: RunSpec, code_dir: str | None = None, python: str | None = None) -> list[str]:
    """After the tasks: a training run's goodput.json for this allocation
    (launcher/views/goodputend.py: final unless requeued); requeue when they
    checkpointed after a signal and Slurm's own view of the job says it was
    preempted or is near its time limit; end when it was cancelled; name the
    first failing rank."""
    ledger = f'"$MESHRUN_RUN_DIR/{REQUEUES_FILE}"'
    py = python or shlex.quote(sys.executable)
    env = f"PYTHONPATH={shlex.quote(code_dir or CODE_DIR)}"
    goodput = (
        [f'{env} {py} -m launcher.selfheal job-end "$MESHRUN_RUN_DIR" "$MESHRUN_RC"']
        if supervised(spec)
        else []
    )
    return [
        "MESHRUN_RC=$?",  # srun's exit status: the highest of the tasks'
        *goodput,
        f'if [ "$MESHRUN_RC" -eq {REQUEUE_EXIT_CODE} ] || [ "$MESHRUN_RC" -eq {UNCOMMITTED_EXIT_CODE} ]; then',
        f'  if [ "$MESHRUN_RC" -eq {UNCOMMITTED_EXIT_CODE} ]; then echo "meshrun: stopped after a signal, but the '
        "final checkpoint did NOT commit (see the log); the work since the newest committed step is lost and a "
        'requeued job resumes from that step" >&2; fi',
        # The tasks cannot tell a preemption's SIGTERM from scancel's; Slurm
        # can: a preempted job is still RUNNING (with a PreemptTime) during
        # its grace time, a cancelled one is COMPLETING/CANCELLED.
        '  MESHRUN_JOB=$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null)',
        "  MESHRUN_STATE=$(echo \"$MESHRUN_JOB\" | sed -n 's/.*JobState=\\([^ ]*\\).*/\\1/p')",
        "  MESHRUN_PREEMPTED=$(echo \"$MESHRUN_JOB\" | sed -n 's/.* PreemptTime=\\([^ ]*\\).*/\\1/p')",
        '  if [ "$MESHRUN_STATE" != RUNNING ]; then',
        '    echo "meshrun: checkpointed after a signal; job $SLURM_JOB_ID is ${MESHRUN_STATE:-unknown to Slurm} '
        '(cancelled, or past its limit): not requeueing"',
        '    exit "$MESHRUN_RC"',
        "  fi",
        '  if [ "${MESHRUN_PREEMPTED:-None}" != None ]; then MESHRUN_CAUSE=preemption; else MESHRUN_CAUSE=time_limit; fi',
        f'  echo "$SLURM_JOB_ID ${{SLURM_RESTART_COUNT:-0}} $MESHRUN_CAUSE $(date +%s)" >> {ledger}',
        '  echo "meshrun: checkpointed after a signal ($MESHRUN_CAUSE: Slurm says JobState=$MESHRUN_STATE '
        'PreemptTime=${MESHRUN_PREEMPTED:-None}); requeueing job $SLURM_JOB_ID"',
        '  scontrol requeue "$SLURM_JOB_ID" && exit 0',
        f"  sed -i '$ d' {ledger}  # not requeued after all",
        '  echo "meshrun: scontrol requeue $SLURM_JOB_ID failed; the checkpoint is kept" >&2',
        'elif [ "$MESHRUN_RC" -ne 0 ]; then',
        f'  MESHRUN_FAILED=$(grep -s "^$SLURM_JOB_ID ${{SLURM_RESTART_COUNT:-0}} rank " "$MESHRUN_RUN_DIR/{FAILURES_FILE}" | head -n 1 | cut -d" " -f3-)',
        '  echo "meshrun: job $SLURM_JOB_ID failed (srun exit $MESHRUN_RC): ${MESHRUN_FAILED:-a task died without a Python error; see the srun lines above}" >&2',
        "fi",
        'exit "$MESHRUN_RC"',
    ]


def _python(spec: RunSpec, python: str | None) -> str:
    """The interpreter tasks run: the container's, or this one (one shell word)."""
    if python is not None:
        return python
    c = spec.cfg.cluster
    return shlex.quote(c.container_python if c.container_image else sys.executable)


def task_command(spec: RunSpec, python: str | None = None, run_dir_expr: str | None = None) -> str:
    """What every task runs. ``run_dir_expr`` is a shell expression (job arrays)."""
    python = _python(spec, python)
    run_dir = run_dir_expr or shlex.quote(spec.run_dir)
    if spec.cfg.job.kind == "script":  # a team's program, under launcher/taskwrap/wrapper.py
        return f"{python} -u -m launcher.taskwrap {run_dir}"
    # train/__main__.py installs the USR2/TERM flag first, then loads torch and trains.
    return f"{python} -u -m train {run_dir}"


def submitit_parameters(
    spec: RunSpec,
    folder: str,
    *,
    code_dir: str | None = None,
    extra_setup: Sequence[str] = (),
    run_dir_expr: str | None = None,
    python: str | None = None,
    run_dirs: Sequence[str] = (),
    project_dir: str | None = None,
) -> dict[str, Any]:
    """Everything but the command, for ``SlurmExecutor.update_parameters``.
    ``run_dirs``: the host dirs a job array mounts for its points;
    ``project_dir``: a script job's packed project dir (launcher/run/codesnap.py)."""
    code_dir = code_dir or CODE_DIR
    check_script_strings(spec, str(folder))
    params = sbatch_parameters(spec)
    if supervised(spec) and run_dir_expr is None:  # not job arrays
        params["nodes"] = spec.plan.nodes + spec.cfg.cluster.spare_nodes
        # A failed node does not end the allocation: the supervisor restarts
        # the step on the others (a spare) or requeues without it.
        params["additional_parameters"]["no-kill"] = True
        # submitit's own srun line is replaced by the supervised one.
        params["use_srun"] = False
    return {
        **params,
        "setup": [
            *extra_setup,
            *([f"export {PROJECT_DIR_ENV}={shlex.quote(project_dir)}"] if project_dir else []),
            *setup_lines(spec, code_dir, run_dir_expr),
            *preflight_lines(spec, str(folder), code_dir, python, run_dirs),
        ],
        "teardown": teardown_lines(spec, code_dir, python),
        "srun_args": srun_args(spec, str(folder), code_dir, run_dirs, project_dir),
    }


def render_sbatch(
    spec: RunSpec,
    folder: str | Path,
    *,
    python: str | None = None,
    code_dir: str | None = None,
    project_dir: str | None = None,
) -> str:
    """The sbatch script submitit submits for ``spec`` with logs in ``folder``."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = submitit_parameters(spec, str(folder), code_dir=code_dir, python=python, project_dir=project_dir)
    command = task_command(spec, python)
    if params.get("use_srun") is False:
        command = supervised_command(
            spec, str(folder), command, params["srun_args"], code_dir=code_dir, python=python
        )
    return _make_sbatch_string(command=command, folder=str(folder), **params)


ARRAY_RUN_DIR_EXPR = '"$MESHRUN_ARRAY_RUN_DIR"'


def array_setup(specs: Sequence[RunSpec]) -> list[str]:
    """Batch lines that pick array task i's run dir (``specs[i].run_dir``)."""
    for s in specs:  # the head's strings are checked with the rest of the script
        if CONTROL.search(s.run_dir):
            raise fail(
                "launcher.run_dir",
                s.run_dir,
                "must not contain control characters (newline, tab, escape, NUL)",
            )
    dirs = " ".join(shlex.quote(s.run_dir) for s in specs)
    return [
        f"MESHRUN_RUN_DIRS=({dirs})",
        'MESHRUN_ARRAY_RUN_DIR="${MESHRUN_RUN_DIRS[$SLURM_ARRAY_TASK_ID]}"',
    ]


def array_parameters(
    specs: Sequence[RunSpec],
    folder: str,
    *,
    code_dir: str | None = None,
    python: str | None = None,
    project_dir: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """Command and parameters of a job array over same-resource points: task i
    trains ``specs[i].run_dir``; env and command name the task's dir, and a
    container mounts every point's dir (the sweep root)."""
    head = specs[0]
    params = submitit_parameters(
        head,
        folder,
        code_dir=code_dir,
        python=python,
        extra_setup=array_setup(specs),
        run_dir_expr=ARRAY_RUN_DIR_EXPR,
        run_dirs=array_mount_dirs([s.run_dir for s in specs], folder),
        project_dir=project_dir,
    )
    params["comment"] = f"meshrun sweep={folder}"
    return task_command(head, python, run_dir_expr=ARRAY_RUN_DIR_EXPR), params


def render_array_sbatch(
    specs: Sequence[RunSpec],
    folder: str | Path,
    *,
    python: str | None = None,
    code_dir: str | None = None,
) -> str:
    """The sbatch script of a job array (``launcher.slurm.submit.submit_array``)."""
    from submitit.slurm.slurm import _make_sbatch_string

    command, params = array_parameters(specs, str(folder), code_dir=code_dir, python=python)
    return _make_sbatch_string(
        command=command, folder=str(folder), map_count=len(specs), array_parallelism=len(specs), **params
    )
