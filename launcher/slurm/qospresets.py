"""Team presets for admins: render ``conf/qos`` as Slurm configuration.

    python -m launcher.qos_admin slurm-conf [--nodes NODES] [--preempt-signal user|term]
                                            [--slurm-version X.Y]
        slurm.conf lines: QOS preemption (PreemptType, PreemptMode and the
        user signal at preemption) and one partition per team preset
    python -m launcher.qos_admin sacctmgr --total-gpus N [--user U]
        sacctmgr commands: QOS (GPU share as GrpTRES, priority, preemption,
        grace time), accounts, and the user's associations
    python -m launcher.qos_admin check [overrides...]
        check a run's partition / qos / account against the live cluster

Presets are read with the schema (launcher.config.schema.QosConfig), so a typo in a
preset fails here as it would at launch.
"""

from __future__ import annotations

import argparse
import getpass
import shlex
import sys
from pathlib import Path

import yaml

from launcher.config.prog import describe, prog
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("python -m launcher.qos_admin"), description=describe(__doc__))
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_conf = sub.add_parser("slurm-conf", help="preemption and partition lines for slurm.conf")
    p_conf.add_argument("--nodes", default="ALL")
    p_conf.add_argument(
        "--preempt-signal",
        choices=("user", "term"),
        default="user",
        help="user: send the job's --signal at preemption (recommended); term: Slurm's default SIGTERM",
    )
    p_conf.add_argument(
        "--slurm-version",
        default="23.02",
        help="Slurm release of the cluster (before 23.02 the user signal is a SlurmctldParameters flag)",
    )
    p_acct = sub.add_parser("sacctmgr", help="sacctmgr commands for QOS, accounts, users")
    p_acct.add_argument("--total-gpus", type=int, required=True)
    p_acct.add_argument("--user", default=getpass.getuser())
    p_check = sub.add_parser("check", help="check a run's partition/qos/account on the live cluster")
    p_check.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)

    if args.cmd == "slurm-conf":
        try:
            version = tuple(int(x) for x in args.slurm_version.split(".")[:2])
        except ValueError:
            version = ()
        if len(version) != 2:
            parser.error(
                f"--slurm-version={args.slurm_version!r} is invalid: expected MAJOR.MINOR, e.g. 22.05"
            )
        lines = preemption_lines(args.preempt_signal == "user", version)  # type: ignore[arg-type]
        print("\n".join([*lines, *partition_lines(load_presets(), args.nodes)]))
    elif args.cmd == "sacctmgr":
        if args.total_gpus < 1:
            parser.error(f"--total-gpus={args.total_gpus} is invalid: must be >= 1")
        print("\n".join(sacctmgr_commands(load_presets(), args.total_gpus, args.user)))
    else:
        from launcher.config.compose import compose
        from launcher.config.spec import RunSpec
        from launcher.config.validate import ConfigError
        from launcher.plan.make import make_plan
        from launcher.slurm.cluster import SlurmError, check_request

        try:
            cfg = compose(args.overrides)
            check_request(RunSpec(cfg, make_plan(cfg), ""))
        except (ConfigError, SlurmError) as e:
            print(f"meshrun: {e}", file=sys.stderr)
            return 2
        print(
            f"ok: partition={cfg.qos.partition} qos={cfg.qos.qos} account={cfg.qos.account} allow this request"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
