"""``python -m launcher.nccl [overrides...]`` (``meshrun nccl``): the exported NCCL settings
of a composed cluster, with where each value came from and why.

The settings and their reasons: launcher/config/ncclenv.py.
"""

from __future__ import annotations

import sys

from launcher.config.ncclenv import describe, expected_busbw_gb_per_s
from launcher.config.prog import describe as describe_doc
from launcher.config.prog import prog


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(argv):
        # Hydra overrides, not argparse flags: the usage and this docstring.
        print(
            f"usage: {prog('python -m launcher.nccl')} [group=option ...] [key=value ...]\n\n{describe_doc(__doc__)}"
        )
        return 0
    from launcher.config.compose import compose
    from launcher.config.validate import ConfigError

    try:
        cfg = compose(argv)
        rows = describe(cfg.cluster)
    except ConfigError as e:
        print(f"meshrun: error: {e}", file=sys.stderr)
        return 2
    print(f"cluster={cfg.cluster.name} fabric={cfg.cluster.fabric}")
    if not rows:
        print("  (no NCCL settings: CPU ranks use gloo)")
    width = max((len(r[0]) + len(r[1]) for r in rows), default=0) + 1
    for key, value, src, reason in rows:
        print(f"  {key}={value}".ljust(width + 3) + f"  [{src}] {reason}")
    bw = expected_busbw_gb_per_s(cfg.cluster)
    if bw:
        print(f"expected all-reduce bus bandwidth: {bw:.0f} GB/s")
    return 0
