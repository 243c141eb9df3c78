"""Team QOS presets (``conf/qos``) as Slurm configuration: slurm.conf lines
for QOS preemption and one partition per team, and the sacctmgr commands for
QOS, accounts and users (the command, ``meshrun qos-admin``:
launcher/commands/qos_admin.py).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from launcher.config.schema import QosConfig
from launcher.plan.qosshare import gpu_share

QOS_DIR = Path(__file__).resolve().parents[2] / "conf" / "qos"


def load_presets(qos_dir: Path = QOS_DIR) -> list[QosConfig]:
    presets = []
    for path in sorted(qos_dir.glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        unknown = set(data) - set(QosConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"{path.name}: unknown keys {sorted(unknown)}; valid: {sorted(QosConfig.__dataclass_fields__)}"
            )
        presets.append(QosConfig(**data))
    return presets


# The first release that spells it PreemptParameters=send_user_signal;
# older ones only know SlurmctldParameters=preempt_send_user_signal.
PREEMPT_PARAMETERS_SINCE = (23, 2)


def preemption_lines(send_user_signal: bool = True, slurm_version: tuple[int, int] = (23, 2)) -> list[str]:
    """slurm.conf lines for QOS preemption that requeues the victim.

    Each QOS's ``GraceTime`` (see :func:`sacctmgr_commands`) is the victim's
    time to checkpoint. With ``send_user_signal`` the victim gets its
    ``--signal`` (USR2: "checkpoint, then requeue") at the start of the grace
    time; without it Slurm sends SIGTERM, the same signal ``scancel`` sends,
    and the job must ask Slurm which of the two happened (meshrun's batch
    script does; other tools often treat SIGTERM as "stop for good").
    """
    lines = ["PreemptType=preempt/qos", "PreemptMode=REQUEUE"]
    if send_user_signal:
        if slurm_version >= PREEMPT_PARAMETERS_SINCE:
            lines.append("PreemptParameters=send_user_signal")
        else:
            lines.append("SlurmctldParameters=preempt_send_user_signal")
    return lines


def partition_lines(presets: list[QosConfig], nodes: str = "ALL") -> list[str]:
    """slurm.conf lines: one partition per team, sharing the nodes; the QOS
    carries the share, priority and preemption."""
    lines = []
    default = QosConfig().partition  # the preset runs get when qos is not chosen
    for q in presets:
        lines.append(
            f"PartitionName={q.partition} Nodes={nodes} MaxTime={q.time_limit_min} "
            f"DefaultTime={min(60, q.time_limit_min)} AllowQos={q.qos} AllowAccounts={q.account} "
            f"PriorityTier={q.priority} Default={'YES' if q.partition == default else 'NO'} State=UP"
        )
    return lines


def sacctmgr_commands(presets: list[QosConfig], total_gpus: int, user: str) -> list[str]:
    """Idempotent: ``add`` may report "already exists"; ``modify`` sets values."""
    cmds = []
    for q in presets:
        cmds.append(f"sacctmgr -i add qos {q.qos}")
    for q in presets:
        # An empty Preempt= makes 22.05's sacctmgr report a preemption loop on
        # later QOS: only set it where the team preempts someone.
        preempt = f" Preempt={','.join(q.preempts)}" if q.preempts else ""
        cmds.append(
            f"sacctmgr -i modify qos {q.qos} set Priority={q.priority} "
            f"GrpTRES=gres/gpu={gpu_share(q, total_gpus)} MaxWall={q.time_limit_min} "
            f"GraceTime={q.grace_time_s} PreemptMode=requeue{preempt} Flags=DenyOnLimit"
        )
    for q in presets:
        cmds.append(f"sacctmgr -i add account {q.account} Description={shlex.quote(q.name + ' team')}")
    for q in presets:
        cmds.append(f"sacctmgr -i add user {user} Account={q.account}")
        cmds.append(
            f"sacctmgr -i modify user {user} where account={q.account} set QOS={q.qos} DefaultQOS={q.qos}"
        )
    return cmds
