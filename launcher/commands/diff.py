"""``python -m launcher.diff RUN_A RUN_B`` (``meshrun diff``): what differs
between two runs, grouped (config, code, packages, image, data; the loss
curves' first divergent step). Exit 0 when identical, 1 when not, 2 when a
dir is not a run. The comparison lives in :mod:`launcher.views.rundiff`.
Two LOGIN:RUN_DIR of one login node (runs submitted over SSH) are compared
there (launcher/views/remoterun.py); one here and one there is refused."""

from __future__ import annotations

import argparse
import sys

from launcher.config.prog import describe, prog
from launcher.config.validate import ConfigError
from launcher.slurm.remote import RemoteError
from launcher.views.remoterun import diff_remote
from launcher.views.rundiff import diff_runs, report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("python -m launcher.diff"), description=describe(__doc__))
    ap.add_argument("run_a", help="a run dir (with run_record.json), or LOGIN:RUN_DIR on a cluster")
    ap.add_argument("run_b", help="the run dir to compare it with")
    ap.add_argument("--no-code-diff", action="store_true", help="name changed files only, without their diff")
    args = ap.parse_args(argv)
    try:
        remote = diff_remote(args.run_a, args.run_b, ["--no-code-diff"] if args.no_code_diff else [])
        if remote is not None:
            return remote
        d = diff_runs(args.run_a, args.run_b)
    except ConfigError as e:
        print(f"meshrun: error: {e}", file=sys.stderr)
        return 2
    except RemoteError as e:
        print(f"meshrun: error: {e}", file=sys.stderr)
        return 3
    print("\n".join(report(d, show_code=not args.no_code_diff)))
    return 0 if d.identical else 1
