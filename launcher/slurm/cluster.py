"""Thin helpers over Slurm's commands (squeue, sacct, scontrol, sacctmgr,
sbatch --test-only), and the pre-submission check of a run's partition /
qos / account against the live cluster.

Every command runs with a timeout; a missing or unreachable Slurm raises
:class:`SlurmUnavailable` with one clear sentence (which file or SLURM_CONF is
missing when Slurm is not configured); any other failure is a one-line
:class:`SlurmError`, never a ``CalledProcessError``.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from launcher.config.schema import QosConfig
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError, parse_login
from launcher.slurm.remote import RemoteError, remote_user, slurm_run
from launcher.slurm.render import render_sbatch

TIMEOUT_S = 20.0


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is one line (command, exit code, Slurm's error)."""


class SlurmUnavailable(SlurmError):
    """No Slurm reachable from here (commands missing, not configured, or controller down)."""


def slurm_reachable() -> bool:
    """sbatch and squeue are on PATH (a dry run asks Slurm only then)."""
    return shutil.which("sbatch") is not None and shutil.which("squeue") is not None


TESTCLUSTER_HINT = (
    'for the local test cluster: scripts/testcluster.sh start; eval "$(scripts/testcluster.sh env)"'
)


def config_problem() -> str | None:
    """Why Slurm's commands cannot find their configuration, or None. Checked
    before running one: with SLURM_CONF pointing at a missing file they retry
    for 60 s before failing."""
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        return (
            f"Slurm is not configured here: SLURM_CONF={conf} does not exist; "
            "export SLURM_CONF=<path of slurm.conf> (or unset it to use the default)"
        )
    return None


def one_line(text: str) -> str:
    """Slurm's error lines, without the repeated ``sinfo: error:`` noise."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.search(r"error|fatal|invalid|denied", ln, re.I)] or lines[-1:]
    return "; ".join(dict.fromkeys(errors))[:500] or "no output"


def run(
    args: list[str],
    *,
    timeout: float = TIMEOUT_S,
    check: bool = True,
    env: dict[str, str] | None = None,
    login: str = "",
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Slurm command ``args``: here, or on the login node ``login``
    (``cluster.login``, checked first) over ssh (launcher/slurm/remote.py);
    ``stdin``: its input. Either way the same errors: :class:`SlurmUnavailable`,
    :class:`SlurmError`."""
    out = _over_ssh(args, timeout, env, login, stdin) if login else _here(args, timeout, env, stdin)
    msg = (out.stderr or out.stdout).strip()
    # The login node's Slurm configuration is not this machine's SLURM_CONF: said as its Slurm says it.
    on = f" on {login}" if login else ""
    if (
        out.returncode
        and not login
        and re.search(r"Could not establish a configuration source|s_p_parse_file", msg)
    ):
        # No slurm.conf where Slurm looks (SLURM_CONF unset: its built-in path,
        # then a configless DNS record).
        where = (
            f"SLURM_CONF={os.environ['SLURM_CONF']}"
            if os.environ.get("SLURM_CONF")
            else "SLURM_CONF is unset, so Slurm looked for /etc/slurm/slurm.conf and a DNS SRV record"
        )
        raise SlurmUnavailable(
            f"Slurm is not configured here: `{args[0]}` found no slurm.conf ({where}); "
            f"export SLURM_CONF=<path of slurm.conf> ({TESTCLUSTER_HINT})"
        )
    if check and out.returncode:
        if re.search(
            r"Unable to contact slurm controller|Connection refused|Socket timed out|connect", msg, re.I
        ):
            raise SlurmUnavailable(f"no Slurm controller reachable{on} ({args[0]}: {msg.splitlines()[-1]})")
        raise SlurmError(f"`{shlex.join(args)}` failed{on} (exit {out.returncode}): {one_line(msg)}")
    return out


def _here(
    args: list[str], timeout: float, env: dict[str, str] | None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    if shutil.which(args[0]) is None:
        raise SlurmUnavailable(
            f"no Slurm reachable from here: `{args[0]}` is not installed ({TESTCLUSTER_HINT})"
        )
    problem = config_problem()
    if problem:
        raise SlurmUnavailable(problem)
    try:
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **env} if env else None,
            input=stdin,
        )
    except subprocess.TimeoutExpired as e:
        raise SlurmUnavailable(
            f"no Slurm answered: `{' '.join(args)}` timed out after {timeout:.0f} s"
        ) from e


def _over_ssh(
    args: list[str], timeout: float, env: dict[str, str] | None, login: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    data = stdin.encode() if stdin is not None else None
    try:
        return slurm_run(parse_login(login), args, timeout=timeout, env=env, stdin=data)
    except RemoteError as e:
        raise SlurmUnavailable(str(e)) from e


def reachable(login: str = "") -> bool:
    try:
        return run(["scontrol", "ping"], timeout=10, check=False, login=login).returncode == 0
    except SlurmUnavailable:
        return False


# --- cluster facts -------------------------------------------------------


def _kv(line: str) -> dict[str, str]:
    """``Key=Value Key2=Value2`` (scontrol -o) into a dict."""
    return dict(m.groups() for m in re.finditer(r"(\S+?)=(\S*)", line))


# Each query below asks this machine's Slurm, or with ``login`` (cluster.login)
# the login node's over ssh.


def partition(name: str, *, login: str = "") -> dict[str, str] | None:
    out = run(["scontrol", "-o", "show", "partition", name], check=False, login=login)
    if out.returncode or not out.stdout.strip():
        return None
    return _kv(out.stdout.strip())


def partitions(*, login: str = "") -> list[str]:
    out = run(["sinfo", "-h", "-o", "%R"], login=login)
    return sorted(set(out.stdout.split()))


def nodes(node_expr: str, *, login: str = "") -> list[dict[str, str]]:
    out = run(["scontrol", "-o", "show", "node", node_expr], check=False, login=login)
    return [_kv(line) for line in out.stdout.splitlines() if line.strip()]


def node_gpus(node: dict[str, str]) -> int:
    m = re.search(r"gpu(?::[^:(,]+)?:(\d+)", node.get("Gres", ""))
    return int(m.group(1)) if m else 0


# QOS limits on what one request may hold, as sacctmgr names them, with what
# each counts (GrpTRES: all jobs of the QOS together; the Max*: one account,
# one user, one job, one node).
QOS_TRES_LIMITS = {
    "GrpTRES": "all jobs of the QOS together",
    "MaxTRESPerAccount": "the jobs of one account",
    "MaxTRESPerUser": "the jobs of one user",
    "MaxTRES": "one job",
    "MaxTRESPerNode": "one node of a job",
}


def qos_table(*, login: str = "") -> dict[str, dict[str, str]]:
    """Every QOS with its limits, as ``sacctmgr show qos`` reports them."""
    fields = ["Name", *QOS_TRES_LIMITS, "MaxWall", "Flags"]
    out = run(["sacctmgr", "-n", "-P", "show", "qos", f"format={','.join(fields)}"], login=login)
    rows = [dict(zip(fields, line.split("|"), strict=False)) for line in out.stdout.splitlines() if line]
    return {r["Name"]: r for r in rows}


def associations(user: str, *, login: str = "") -> list[dict[str, str]]:
    fields = ["Account", "User", "QOS"]
    out = run(
        ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}", f"format={','.join(fields)}"],
        login=login,
    )
    return [dict(zip(fields, line.split("|"), strict=False)) for line in out.stdout.splitlines() if line]


def accounts() -> list[str]:
    out = run(["sacctmgr", "-n", "-P", "show", "account", "format=Account"])
    return sorted(set(out.stdout.split()))


def pyxis_available(*, login: str = "") -> bool:
    out = run(["srun", "--help"], check=False, login=login)
    return "--container-image" in out.stdout + out.stderr


def _minutes(slurm_time: str) -> float | None:
    """``[D-]HH:MM:SS`` / ``MM`` / ``UNLIMITED`` into minutes (None = no limit)."""
    if not slurm_time or slurm_time in ("UNLIMITED", "INFINITE", "Partition_Limit"):
        return None
    days, _, rest = slurm_time.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    h, m, sec = {3: parts, 2: [0, *parts], 1: [0, *parts, 0]}[len(parts)]
    return (int(days or 0) * 24 + h) * 60 + m + sec / 60


def _tres(tres: str, name: str) -> int | None:
    """One TRES count (``gres/gpu``, ``node``) of a ``a=1,b=2`` list, or None (no limit)."""
    m = re.search(rf"(?:^|,){re.escape(name)}=(\d+)", tres or "")
    return int(m.group(1)) if m else None


def qos_limit_problem(qos_name: str, limits: dict[str, str], nodes: int, gpus_per_node: int) -> str | None:
    """Why the QOS's limits (a row of :func:`qos_table`) can never admit a
    request of ``nodes`` x ``gpus_per_node`` GPUs (as Slurm counts them), with
    what to change; None when they can. Every limit alone bounds one request."""
    gpus = nodes * gpus_per_node
    asked = f"{nodes} node{'s' if nodes > 1 else ''} x {gpus_per_node} GPUs = {gpus} GPUs"
    for field, scope in QOS_TRES_LIMITS.items():
        tres = limits.get(field, "")
        per_node = field == "MaxTRESPerNode"
        gpu_limit, node_limit = _tres(tres, "gres/gpu"), _tres(tres, "node")
        if gpu_limit is not None and (gpus_per_node if per_node else gpus) > gpu_limit:
            if per_node or gpu_limit < gpus_per_node:
                fix = f"cluster.gpus_per_node<={gpu_limit} with launcher.exclusive=false"
            else:
                fix = f"cluster.nodes<={gpu_limit // gpus_per_node}"
            return (
                f"the request ({asked}) is over QOS {qos_name}'s limit {field} gres/gpu={gpu_limit} "
                f"(the GPUs {scope} may hold, from sacctmgr show qos): set {fix}, or choose a qos "
                "preset whose QOS allows more"
            )
        if node_limit is not None and not per_node and nodes > node_limit:
            return (
                f"the request ({asked}) is over QOS {qos_name}'s limit {field} node={node_limit} "
                f"(the nodes {scope} may hold, from sacctmgr show qos): set cluster.nodes<={node_limit}, "
                "or choose a qos preset whose QOS allows more"
            )
    return None


def check_request(spec: RunSpec) -> None:
    """Fail before submission when the partition / qos / account do not exist
    or do not allow this request; the message says what to change."""
    part, qos = _check_names(spec.cfg.qos, spec.cfg.cluster.login)
    _check_limits(spec, part, qos)


def _check_names(q: QosConfig, login: str = "") -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The partition, QOS and account exist and allow each other (on the
    login node's cluster with ``login``); returns (the partition's fields, the QOS table)."""
    part = partition(q.partition, login=login)
    if part is None:
        raise ConfigError(
            f"qos.partition={q.partition!r} is invalid: no such partition on this cluster; "
            f"choose one of {', '.join(partitions(login=login))} (or a qos preset that names one)"
        )
    qos = qos_table(login=login)
    if q.qos not in qos:
        raise ConfigError(
            f"qos.qos={q.qos!r} is invalid: no such QOS; choose one of {', '.join(sorted(qos))}"
        )
    user = _user(login)
    assocs = associations(user, login=login)
    if q.account not in {a["Account"] for a in assocs}:
        known = sorted({a["Account"] for a in assocs}) or [
            "<none: ask an admin (python -m launcher.qos_admin)>"
        ]
        raise ConfigError(
            f"qos.account={q.account!r} is invalid: user {user} has no association with it; "
            f"choose one of {', '.join(known)}"
        )
    allowed_qos = {x for a in assocs if a["Account"] == q.account for x in a["QOS"].split(",") if x}
    if allowed_qos and q.qos not in allowed_qos:
        raise ConfigError(
            f"qos.qos={q.qos!r} is invalid for account {q.account}: allowed {', '.join(sorted(allowed_qos))}"
        )
    allow_qos = part.get("AllowQos", "ALL")
    if allow_qos != "ALL" and q.qos not in allow_qos.split(","):
        raise ConfigError(
            f"qos.qos={q.qos!r} is not allowed in partition {q.partition} (AllowQos={allow_qos})"
        )
    allow_acct = part.get("AllowAccounts", "ALL")
    if allow_acct != "ALL" and q.account not in allow_acct.split(","):
        raise ConfigError(
            f"qos.account={q.account!r} is not allowed in partition {q.partition} (AllowAccounts={allow_acct})"
        )
    return part, qos


def _user(login: str) -> str:
    """The user whose associations count: this one, or the login node's."""
    if not login:
        return getpass.getuser()
    try:
        return remote_user(parse_login(login))
    except RemoteError as e:
        raise SlurmUnavailable(str(e)) from e


def _check_limits(spec: RunSpec, part: dict[str, str], qos: dict[str, dict[str, str]]) -> None:
    """Limits: nodes, GPUs per node, time, GPU share; Pyxis for a container."""
    cfg, plan = spec.cfg, spec.plan
    q, c = cfg.qos, cfg.cluster
    part_nodes = nodes(part.get("Nodes", ""), login=c.login)
    total = int(part.get("TotalNodes", len(part_nodes)) or 0)
    max_nodes = part.get("MaxNodes", "UNLIMITED")
    if plan.nodes > total or (max_nodes.isdigit() and plan.nodes > int(max_nodes)):
        raise ConfigError(
            f"cluster.nodes={plan.nodes} is invalid: partition {q.partition} has {total} nodes"
            + (f" and allows {max_nodes} per job" if max_nodes.isdigit() else "")
            + "; lower cluster.nodes"
        )
    gpus_here = max((node_gpus(n) for n in part_nodes), default=0)
    if c.gpus_per_node > gpus_here:
        raise ConfigError(
            f"cluster.gpus_per_node={c.gpus_per_node} is invalid: the nodes of partition {q.partition} "
            f"have {gpus_here} GPUs; set cluster.gpus_per_node<={gpus_here}"
        )
    limit = _minutes(part.get("MaxTime", ""))
    if limit is not None and q.time_limit_min > limit:
        raise ConfigError(
            f"qos.time_limit_min={q.time_limit_min} is invalid: partition {q.partition} allows "
            f"{limit:.0f} minutes; set qos.time_limit_min<={limit:.0f}"
        )
    qos_wall = _minutes(qos[q.qos].get("MaxWall", ""))
    if qos_wall is not None and q.time_limit_min > qos_wall:
        raise ConfigError(
            f"qos.time_limit_min={q.time_limit_min} is invalid: QOS {q.qos} allows {qos_wall:.0f} minutes"
        )
    # The QOS's limits, read from Slurm: exclusive nodes count every GPU of the node.
    per_node = gpus_here if cfg.launcher.exclusive else c.gpus_per_node
    problem = qos_limit_problem(q.qos, qos[q.qos], plan.nodes, per_node)
    if problem:
        if cfg.launcher.exclusive and gpus_here > c.gpus_per_node:
            problem += "; launcher.exclusive=false counts only the GPUs asked for"
        raise ConfigError(problem)
    if c.container_image and not pyxis_available(login=c.login):
        raise ConfigError(
            f"cluster.container_image={c.container_image!r} is invalid here: this cluster's srun has no "
            "--container-image (Pyxis is not installed); unset cluster.container_image"
        )


def test_only(spec: RunSpec) -> str:
    """``sbatch --test-only``: when and where the job would start, or why not.
    On a login node (cluster.login) the script goes on sbatch's stdin: nothing is written there."""
    if spec.cfg.cluster.login:
        script = render_sbatch(spec, os.path.join(spec.run_dir, "slurm"))
        out = run(["sbatch", "--test-only"], check=False, login=spec.cfg.cluster.login, stdin=script)
        return _test_only_answer(out)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "test.sh")
        with open(path, "w") as f:
            f.write(render_sbatch(spec, tmp))
        out = run(["sbatch", "--test-only", path], check=False)
    return _test_only_answer(out)


def _test_only_answer(out: subprocess.CompletedProcess[str]) -> str:
    text = (out.stderr + out.stdout).strip()
    return re.sub(r"^sbatch: ", "", text.splitlines()[-1] if text else "no answer from sbatch --test-only")


# --- jobs ------------------------------------------------------------------


@dataclass
class JobRecord:
    job_id: str
    name: str
    state: str
    elapsed: str
    nodes: str
    node_list: str
    exit_code: str
    restarts: int = 0


def split_named(line: str, n_fields: int) -> list[str] | None:
    """A ``sacct -P`` line whose second field is JobName: free text that may
    hold '|', which sacct does not escape. Every other field is fixed, so the
    name is what lies between the first and the last ``n_fields - 2``."""
    parts = line.split("|")
    if len(parts) < n_fields:
        return None
    tail = n_fields - 2
    return [parts[0], "|".join(parts[1 : len(parts) - tail]), *parts[len(parts) - tail :]]


SACCT_FIELDS = ["JobID", "JobName", "State", "Elapsed", "NNodes", "NodeList", "ExitCode"]


def jobs(job_ids: list[str], *, login: str = "") -> dict[str, JobRecord]:
    """The latest record of each job (array tasks included), with the number
    of earlier runs (requeues) counted from sacct's duplicates; ``login``:
    the cluster's login node (cluster.login), "" this machine."""
    if not job_ids:
        return {}
    out = run(
        ["sacct", "-n", "-P", "-X", "-D", "-j", ",".join(job_ids), f"--format={','.join(SACCT_FIELDS)}"],
        login=login,
    )
    records: dict[str, JobRecord] = {}
    runs: dict[str, int] = {}
    for line in out.stdout.splitlines():
        parts = split_named(line, len(SACCT_FIELDS))
        if not parts:
            continue
        rec = JobRecord(*parts)
        rec.state = rec.state.split()[0]  # "CANCELLED by 0" -> CANCELLED
        runs[rec.job_id] = runs.get(rec.job_id, 0) + 1
        records[rec.job_id] = rec  # sacct lists runs oldest first
    for jid, rec in records.items():
        rec.restarts = runs[jid] - 1
    return records


def cancel(job_id: str, *, login: str = "") -> None:
    run(["scancel", job_id], login=login)


# --- accounting and queue for many jobs at once (fleet, goodput) -----------

# Every run of each job (-D: a requeued job's earlier runs too), times as
# Unix seconds (SLURM_TIME_FORMAT=%s), one line per run, oldest first.
ACCOUNTING_FIELDS = [
    "JobID", "JobName", "State", "Submit", "Start", "End", "NNodes", "NodeList", "AllocTRES",
    "ReqTRES", "ExitCode", "Reason", "Partition", "QOS", "User", "Account",
]  # fmt: skip
QUEUE_FIELDS = ["JobID", "State", "Reason", "StartTime", "Partition", "QOS", "UserName"]


def accounting(job_ids: list[str], *, login: str = "") -> list[dict[str, str]]:
    """One ``sacct`` call for all these jobs: each run of each job as a
    dict of :data:`ACCOUNTING_FIELDS` (times in Unix seconds, or
    ``Unknown`` / ``None`` when not reached)."""
    if not job_ids:
        return []
    out = run(
        ["sacct", "-n", "-P", "-X", "-D", "-j", ",".join(job_ids), f"--format={','.join(ACCOUNTING_FIELDS)}"],
        env={"SLURM_TIME_FORMAT": "%s"},
        login=login,
    )
    rows = []
    for line in out.stdout.splitlines():
        parts = split_named(line, len(ACCOUNTING_FIELDS))
        if parts:
            rows.append(dict(zip(ACCOUNTING_FIELDS, parts, strict=True)))
    return rows


def queue() -> list[dict[str, str]]:
    """One ``squeue --start``-style call for every pending and running job:
    state, Slurm's reason and the expected start (Unix seconds, or ``N/A``)."""
    fmt = "|".join(f"%{c}" for c in ("i", "T", "r", "S", "P", "q", "u"))
    out = run(["squeue", "-h", "-a", "-o", fmt], env={"SLURM_TIME_FORMAT": "%s"})
    return [
        dict(zip(QUEUE_FIELDS, line.split("|"), strict=False))
        for line in out.stdout.splitlines()
        if line.count("|") == len(QUEUE_FIELDS) - 1
    ]


# --- every user's jobs at once (meshrun fleet --all-users) ------------------

# Fields split on a separator no job name, comment or command line holds.
UNIT_SEP = "\x1f"
ALL_USERS_FIELDS = [*ACCOUNTING_FIELDS, "Comment", "SubmitLine"]
QUEUE_ALL_FIELDS = [*QUEUE_FIELDS, "Name", "Comment", "NumGPUs"]


def accounting_all_users(since: str) -> list[dict[str, str]]:
    """One ``sacct -a`` call: each run of every user's job since ``since``
    (``YYYY-MM-DDTHH:MM:SS``, local time), :data:`ALL_USERS_FIELDS`."""
    out = run(
        ["sacct", "-a", "-n", "-P", "-X", "-D", f"--delimiter={UNIT_SEP}", "-S", since,
         f"--format={','.join(ALL_USERS_FIELDS)}"],
        env={"SLURM_TIME_FORMAT": "%s"},
    )  # fmt: skip
    rows = []
    for line in out.stdout.splitlines():
        parts = line.split(UNIT_SEP)
        if len(parts) == len(ALL_USERS_FIELDS):
            rows.append(dict(zip(ALL_USERS_FIELDS, parts, strict=True)))
    return rows


def queue_all_users() -> list[dict[str, str]]:
    """One ``squeue -a`` call for every user's pending and running jobs:
    :data:`QUEUE_FIELDS` plus the job name, its comment and GPUs (``%b``: gres)."""
    fmt = UNIT_SEP.join(f"%{c}" for c in ("i", "T", "r", "S", "P", "q", "u", "j", "k", "b"))
    out = run(["squeue", "-h", "-a", "-o", fmt], env={"SLURM_TIME_FORMAT": "%s"})
    return [
        dict(zip(QUEUE_ALL_FIELDS, line.split(UNIT_SEP), strict=True))
        for line in out.stdout.splitlines()
        if line.count(UNIT_SEP) == len(QUEUE_ALL_FIELDS) - 1
    ]
