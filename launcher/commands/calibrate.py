"""``python -m launcher.calibrate RUN_DIR... [--params a,b] [--out FILE]``:
refit calibration parameters to the step times of real runs.

Each run directory holds ``spec.json`` (config + plan) and ``metrics.jsonl``;
the fit and what it adjusts: launcher/perf/calibrate.py.
"""

from __future__ import annotations

import argparse
import math
import sys

from launcher.config.validate import ConfigError
from launcher.perf.calibrate import _get, default_params, fit, load_run, loss, predicted_step
from launcher.perf.params import load_params, save_params


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launcher.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run directories (spec.json + metrics.jsonl)")
    ap.add_argument("--params", default="", help="comma-separated parameter names (default: by device)")
    ap.add_argument("--perf", default="", help="starting calibration (default conf/perf/default.yaml)")
    ap.add_argument("--skip", type=int, default=1, help="warm-up metric lines to leave out")
    ap.add_argument("--out", default="", help="write the fitted calibration YAML here")
    a = ap.parse_args(argv)
    try:
        start = load_params(a.perf or None)
        runs = [load_run(r, a.skip) for r in a.runs]
        names = a.params.split(",") if a.params else default_params(runs, start)
        fitted = fit(runs, start, names)
    except (ConfigError, ValueError, KeyError, AttributeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{'run':40s} {'measured s':>11s} {'before s':>9s} {'after s':>9s}")
    for r in runs:
        print(
            f"{r.run_dir[-40:]:40s} {r.step_time_s:11.4g} {predicted_step(r, start):9.4g} {predicted_step(r, fitted):9.4g}"
        )
    for n in names:
        print(f"{n}: {_get(start, n):.4g} -> {_get(fitted, n):.4g}")
    print(f"rms log error: {math.sqrt(loss(runs, start)):.3f} -> {math.sqrt(loss(runs, fitted)):.3f}")
    if a.out:
        save_params(fitted, a.out)
        print(f"wrote {a.out}")
    return 0
