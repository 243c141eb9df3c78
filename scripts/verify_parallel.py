#!/usr/bin/env python
"""Run the parallel-layout matrix on CPU (gloo) and compare each layout with a
single-process run of the same model, seed and data over 5 optimizer steps.

    python scripts/verify_parallel.py            # the whole matrix
    python scripts/verify_parallel.py --quick    # the CI subset (< 3 min here)
    python scripts/verify_parallel.py --only pp2_zbv,tp4_sp

Last line: ``verify_parallel: N passed, M failed``; exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from parallel_layouts import HEADER, LAYOUTS, REFERENCE, REFERENCE_BF16, compare, format_row, run_layout  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the CI subset")
    ap.add_argument("--only", default="", help="comma-separated layout names")
    ap.add_argument("--json", default="", help="also write the rows to this JSON file")
    args = ap.parse_args()
    chosen = [lay for lay in LAYOUTS if not args.quick or lay.quick]
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {lay.name for lay in LAYOUTS}
        if unknown:
            ap.error(f"unknown layouts {sorted(unknown)}; choose from {[lay.name for lay in LAYOUTS]}")
        chosen = [lay for lay in LAYOUTS if lay.name in names]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="verify_parallel-") as work:
        os.environ["TMPDIR"] = work  # torchrun-style leftovers stay in here
        ref = run_layout(REFERENCE, work)
        if ref.error:
            print(f"reference run failed: {ref.error}")
            print("verify_parallel: 0 passed, 1 failed")
            return 1
        print(f"reference: 1 process, losses {', '.join(f'{x:.5f}' for x in ref.losses)}")
        ref_bf16 = None
        if any(lay.kind == "bf16" for lay in chosen):
            ref_bf16 = run_layout(REFERENCE_BF16, work)
            compare(ref_bf16, ref)
            print(
                f"bf16 reference: 1 process, max |loss diff| vs fp32 {ref_bf16.loss_diff:.2e} (information)"
            )
        print(HEADER)
        outcomes = []
        for lay in chosen:
            o = run_layout(lay, work)
            compare(o, ref_bf16 if lay.kind == "bf16" and ref_bf16 is not None else ref)
            print(format_row(o), flush=True)
            outcomes.append(o)
    passed = sum(o.passed for o in outcomes)
    if args.json:
        rows = [
            {
                "layout": o.layout.name,
                "ranks": o.layout.ranks,
                "passed": o.passed,
                "loss_diff": o.loss_diff,
                "grad_norm_diff": o.grad_norm_diff,
                "tol": o.tol,
                "step_time_s": o.step_time_s,
                "error": o.error,
            }
            for o in outcomes
        ]
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"total wall {time.perf_counter() - t0:.0f} s")
    print(f"verify_parallel: {passed} passed, {len(outcomes) - passed} failed")
    return 0 if passed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
