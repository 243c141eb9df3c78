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
import sys

from launcher.config.prog import describe, prog
from launcher.slurm.qospresets import load_presets, partition_lines, preemption_lines, sacctmgr_commands


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
