"""Loss and throughput curves of a run or of every point of a sweep, as one
PNG (``python -m launcher.status DIR --png FILE``), read from each run's
``metrics.jsonl``. matplotlib is imported only here, when a plot is asked for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from launcher.config.runfiles import METRICS_FILE


def step_series(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{"loss": [(step, value), ...], "tokens_per_s": [...]}`` from the run's
    logged steps; a step logged twice (a rerun after a restart) keeps the last."""
    path = Path(run_dir) / METRICS_FILE
    series: dict[str, dict[int, float]] = {"loss": {}, "tokens_per_s": {}}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if "event" in rec or "step" not in rec:
                continue
            for key, values in series.items():
                if isinstance(rec.get(key), (int, float)):
                    values[int(rec["step"])] = float(rec[key])
    return {k: sorted(v.items()) for k, v in series.items()}


def plot_runs(runs: Sequence[tuple[str, str]], png: str | Path) -> int:
    """Plot (label, run dir) pairs: loss and tokens/s against step, one line
    per run. Returns the number of runs that had logged steps."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a login node
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_tps) = plt.subplots(1, 2, figsize=(11, 4))
    plotted = 0
    for label, run_dir in runs:
        s = step_series(run_dir)
        if not s["loss"]:
            continue
        plotted += 1
        ax_loss.plot(*zip(*s["loss"], strict=True), marker=".", label=f"point {label}")
        if s["tokens_per_s"]:
            ax_tps.plot(*zip(*s["tokens_per_s"], strict=True), marker=".", label=f"point {label}")
    ax_loss.set(title="training loss", xlabel="step", ylabel="loss")
    ax_tps.set(title="throughput", xlabel="step", ylabel="tokens/s (whole job)")
    for ax in (ax_loss, ax_tps):
        ax.grid(alpha=0.3)
        if plotted:
            ax.legend(fontsize="small")
    if not plotted:
        ax_loss.text(0.5, 0.5, "no logged steps yet", ha="center", va="center", transform=ax_loss.transAxes)
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return plotted
