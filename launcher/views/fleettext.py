"""The fleet view (:mod:`launcher.views.fleetrows`) as text: the terminal table
of ``meshrun fleet`` and its Prometheus exposition (``--prom``)."""

from __future__ import annotations

import os
import time

from launcher.config.schema import LauncherConfig
from launcher.views import goodput as gp
from launcher.views.fleetrows import FleetView


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def step_text(step: int | None, steps: int | None) -> str:
    """``n/total``; ``n`` when the total is unknown; ``-`` before any step."""
    if step is None:
        return "-"
    return str(step) if not steps else f"{step}/{steps}"


def _table(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=False)]
    return "\n".join(
        "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=False)).rstrip()
        for line in [head, *body]
    )


def format_view(view: FleetView) -> str:
    parts = [
        f"{time.strftime('%H:%M:%S', time.localtime(view.updated))}  {view.root}  ({len(view.runs)} runs)"
    ]
    if view.scheduler_error:
        parts.append(f"meshrun: Slurm not read: {view.scheduler_error}")
    parts.append(_runs_table(view))
    parts += _pipeline_lines(view)
    parts += _pending_tables(view)
    parts += _others_tables(view)
    parts += _totals_tables(view)
    parts += _bad_node_tables(view)
    if view.budget:
        b = view.budget
        parts.append(
            f"\nbudget ${b['budget_usd']:.2f}: spent ${b['spent_usd']:.2f}, left ${b['left_usd']:.2f}, "
            f"projected at completion ${b['projected_usd']:.2f}"
            + ("  OVER BUDGET" if b["projected_usd"] > b["budget_usd"] else "")
            + (f"  ({b['source']})" if b.get("source") else "")
        )
    return "\n".join(parts)


def _runs_table(view: FleetView) -> str:
    head = ["RUN", "MODEL", "CLUSTER", "PROGRAM", "JOB", "STATE", "STEP", "TOKENS", "LOSS", "TOK/S", "GPU-H", "COST $", "PROJ $", "FINISH P50 / P90", "ETTR", "RESTARTS", "FAULTS", "REDONE", "RUN DIR"]  # fmt: skip
    body = [
        [
            r.run,
            r.model or "-",
            r.cluster or "-",
            r.program or "-",
            r.job_id or "-",
            r.state,
            step_text(r.step, r.steps),
            _f(r.tokens, ".3g"),
            _f(r.loss, ".4f"),
            _f(r.tokens_per_s, ".0f"),
            _f(r.gpu_hours, ".3f"),
            _f(r.cost_usd, ".2f"),
            _f(r.projected_usd, ".2f"),
            r.finish or "-",
            _f(None if r.ettr is None else 100 * r.ettr, ".1f") + ("%" if r.ettr is not None else ""),
            "-" if r.restarts is None else str(r.restarts),
            str(r.faults),
            "-" if r.redone is None else str(r.redone),
            _below(r.run_dir, view.root),
        ]  # fmt: skip
        for r in view.runs
    ]
    return _table(head, body)


def _pipeline_lines(view: FleetView) -> list[str]:
    """A pipeline as one line: its stages in order, each with its state."""
    if not view.pipelines:
        return []
    lines = ["\npipelines:"]
    for p in view.pipelines:
        stages = " -> ".join(f"{s['stage']} {s['state']} (step {s['step']})" for s in p["stages"])
        lines.append(f"  {p['pipeline']}: {stages}")
    return lines


def _below(run_dir: str, root: str) -> str:
    """The run dir relative to the runs root (short; the RUN column has its id)."""
    rel = os.path.relpath(run_dir, os.path.abspath(root))
    return run_dir if rel.startswith("..") else rel


def _others_tables(view: FleetView) -> list[str]:
    """--all-users: meshrun jobs Slurm knows that are not under the runs root."""
    if not view.others:
        return []
    head = ["JOB", "NAME", "USER", "QOS", "PARTITION", "STATE", "GPUS", "GPU-H", "REASON", "RUN DIR"]
    body = [
        [r.job_id or "-", r.run, r.user or "-", r.qos or "-", r.partition or "-", r.state, str(r.gpus)]
        + [_f(r.gpu_hours, ".3f"), r.reason or "-", r.run_dir or "-"]
        for r in view.others
    ]
    return [f"\nother meshrun jobs Slurm knows (not under {view.root}):", _table(head, body)]


def _pending_tables(view: FleetView) -> list[str]:
    parts: list[str] = []
    pending = [r for r in view.runs if r.state == "PENDING"]
    if pending:
        parts.append("\npending:")
        parts.append(
            _table(
                ["RUN", "JOB", "REASON", "EXPECTED START"],
                [
                    [
                        r.run,
                        r.job_id or "-",
                        r.reason or "-",
                        time.strftime("%Y-%m-%d %H:%M", time.localtime(r.expected_start))
                        if r.expected_start
                        else "unknown",
                    ]  # fmt: skip
                    for r in pending
                ],
            )
        )
    return parts


def _totals_tables(view: FleetView) -> list[str]:
    parts: list[str] = []
    for key in ("user", "qos", "partition"):
        head_t = [key.upper(), "RUNS", "GPU-H", "COST $", "GPUS NOW", "PENDING"]
        rows_t = []
        for g in view.totals[key]:
            line = [
                g[key],
                str(g["runs"]),
                f"{g['gpu_hours']:.3f}",
                f"{g['cost_usd']:.2f}",
                str(g["gpus_now"]),
            ]
            line.append(str(g["pending"]))
            if key == "qos":
                line.append(
                    f"{g['gpus_now']}/{g['share_gpus']} GPUs ({g['share_pct']}% preset)"
                    if g.get("share_gpus")
                    else "-"
                )
            rows_t.append(line)
        parts.append(f"\nper {key}:")
        parts.append(_table(head_t + (["SHARE NOW/PRESET"] if key == "qos" else []), rows_t))
    return parts


def _bad_node_tables(view: FleetView) -> list[str]:
    parts: list[str] = []
    if view.bad_nodes:
        parts.append(
            f"\nbad-node ledger (excluded: >= {LauncherConfig().bad_node_faults} faults in the window):"
        )
        parts.append(
            _table(
                ["NODE", "FAULTS", "CAUSES", "LAST", "EXCLUDED"],
                [
                    [
                        n["node"],
                        str(n["faults"]),
                        ",".join(n["causes"]),
                        time.strftime("%Y-%m-%d %H:%M", time.localtime(n["last"])),
                        "yes" if n["excluded"] else "no",
                    ]
                    for n in view.bad_nodes
                ],  # fmt: skip
            )
        )
    return parts


def prom_text(view: FleetView) -> str:
    """Every run's goodput series in one textfile (node_exporter's collector)."""
    meta: dict[str, list[str]] = {}  # series name -> its HELP/TYPE lines, then samples
    for r in view.runs:
        if r.goodput:
            for line in gp.prom_text(r.goodput, r.run).splitlines():
                name = line.split()[2] if line.startswith("#") else line.split("{")[0]
                lines = meta.setdefault(name, [])
                if not line.startswith("#") or line not in lines:
                    lines.append(line)
    return "".join(line + "\n" for lines in meta.values() for line in lines)
