"""Checks of the performance model against measurements it was not fitted
to: ``python -m launcher.perf_validation [--fit]`` prints both sets' errors
(docs/perf-validation.md); ``--fit`` refits the constants on the calibration
sets and writes conf/perf/default.yaml. The rows: launcher/plan/validation.py.
"""

from __future__ import annotations

import argparse

from launcher.perf.calibrate import cpu_params
from launcher.perf.params import DEFAULT_PATH, load_params, update_file
from launcher.plan.published import CALIBRATION, GPU_FIT
from launcher.plan.validation import cpu_measured, refit, report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m launcher.perf_validation", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--fit", action="store_true", help="refit on the calibration sets and write the file")
    ap.add_argument("--perf", default="", help=f"calibration file (default {DEFAULT_PATH})")
    a = ap.parse_args(argv)
    p = load_params(a.perf or None)
    if a.fit:
        fitted = refit(p)
        cpu_fit = [m for m, split, _ in cpu_measured() if split == CALIBRATION]
        names = GPU_FIT + (cpu_params(cpu_fit) if cpu_fit else [])
        update_file(p.source, fitted, names)
        print(f"wrote {p.source}: " + ", ".join(n.split("|")[0] for n in names))
        p = load_params(a.perf or None)
    print(report(p))
    return 0
