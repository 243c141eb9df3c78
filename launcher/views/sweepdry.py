"""The dry run of a sweep (``python -m launcher -m ... launcher.dry_run=true``):
one table with a row per point (the swept values, layout, memory per GPU,
step time, tokens/s, cost, valid or why not), then each distinct warning and
refusal once, with the points it applies to. ``-v`` (``launcher.verbose``)
prints every point's full plan and sbatch script instead (launcher/__main__.py).

Built from the specs the sweep's checks already planned: nothing is planned
again or written, and a script is rendered only to group the points Slurm is
asked about once (when it is reachable). The table of 500 points takes about
0.25 s of CPU; each point's full plan and script was 150 lines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from launcher.plan.memory import memory_figure
from launcher.plan.planner import plan_layout_summary
from launcher.plan.qosshare import share_note
from launcher.views.planreport import swept_keys, text_table, usd

HEAD = ["GPUs", "layout", "mem GB/usable", "step s", "tok/s", "cost", "valid"]
SHORT = 50  # characters of a refusal in the table; the whole reason is printed below it


@dataclass
class DryPoint:
    """One point of the table: its overrides and plan (None: refused for ``reason``)."""

    num: int
    overrides: list[str]
    spec: RunSpec | None = None
    reason: str = ""
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # said once: the code snapshot, sbatch --test-only


def short_reason(reason: str) -> str:
    """The head of a refusal: ``model=1b does not fit``, not the whole remedy."""
    text = reason.split("\n")[0]
    if text.startswith("In '") and "': " in text:  # Hydra's "In 'config': " prefix
        text = text.split("': ", 1)[1]
    text = text.split(" Available options", 1)[0]  # Hydra's list of choices: in the whole reason
    head = text.split(": ", 1)[0]
    text = head if len(head) >= 12 else text
    return text if len(text) <= SHORT else text[: SHORT - 1].rstrip() + "…"


def _row(p: DryPoint) -> list[str]:
    if p.spec is None:
        return ["-"] * (len(HEAD) - 1) + [f"no: {short_reason(p.reason)}"]
    cfg, plan = p.spec.cfg, p.spec.plan
    mem = plan.memory
    used, usable = memory_figure(cfg.cluster, plan.device, mem)  # the dry run's own figure
    memory = f"{used:,.1f}/{usable:,.1f}" if usable else f"{used:,.1f}"
    step, tps = _speed(p.spec)
    return [
        str(plan.world_size),
        plan_layout_summary(plan).split(" (")[0],
        memory,
        step,
        tps,
        usd(plan.cost.usd_on_demand) if plan.cost else "-",
        f"no: {short_reason(p.reason)}" if p.reason else "yes",
    ]


def _speed(spec: RunSpec) -> tuple[str, str]:
    """(step s, tokens/s of the whole job) from the performance model; '-' when it cannot price the plan."""
    from launcher.perf import predict

    try:
        pr = predict(spec.cfg, spec.plan)
    except (ConfigError, ValueError, ZeroDivisionError):
        return "-", "-"
    return f"{pr.step_time_s:.3g}", f"{pr.tokens_per_s_per_gpu * spec.plan.world_size:,.0f}"


def _which(nums: Sequence[int], total: int) -> str:
    if len(nums) == total:
        return f"all {total} points" if total > 1 else "the point"
    if len(nums) <= 6:
        return ("point " if len(nums) == 1 else "points ") + ", ".join(f"#{n}" for n in nums)
    return f"{len(nums)} of {total} points"


def _once(points: Sequence[DryPoint], what: Callable[[DryPoint], list[str]]) -> dict[str, list[int]]:
    """Each distinct text, with the points that said it (first said first)."""
    seen: dict[str, list[int]] = {}
    for p in points:
        for text in dict.fromkeys(what(p)):
            seen.setdefault(text, []).append(p.num)
    return seen


def dry_run_table(points: Sequence[DryPoint]) -> list[str]:
    """The lines of a sweep's dry run: the table, then every warning, note
    and refusal once."""
    keys = swept_keys([p.overrides for p in points])
    values = [dict(o.partition("=")[::2] for o in p.overrides) for p in points]
    head = ["#", *keys, *HEAD]
    rows = [
        [str(p.num), *(v.get(k, "-") for k in keys), *_row(p)] for p, v in zip(points, values, strict=True)
    ]
    layout_col = 1 + len(keys) + HEAD.index("layout")
    lines = text_table(head, rows, left={*range(1, 1 + len(keys)), layout_col, len(head) - 1}).split("\n")
    total = len(points)
    for text, nums in _once(points, lambda p: p.warnings).items():
        lines.append(f"meshrun: warning ({_which(nums, total)}): {text}")
    for text, nums in _once(points, lambda p: p.notes).items():
        lines.append(f"meshrun: {text} ({_which(nums, total)})")
    for text, nums in _once(points, lambda p: [p.reason] if p.reason else []).items():
        lines.append(f"meshrun: refused ({_which(nums, total)}): {text}")
    return lines


def gather(points: Sequence[DryPoint], slurm_reachable: bool) -> None:
    """Each valid point's warnings and notes, as its single dry run says them
    (launcher/__main__.py:dry_run); Slurm is asked once per distinct request."""
    from launcher.run.codesnap import describe, plan_snapshot

    groups: dict[str, list[DryPoint]] = {}
    codes: dict[tuple[str, ...], str] = {}
    for p in points:
        if p.spec is None:
            continue
        cfg = p.spec.cfg
        p.warnings.extend(p.spec.plan.warnings)
        if cfg.cluster.kind != "slurm":
            continue
        # The snapshot reads the checkout and these fields only: hashed once
        # for the points that agree on them, not once a point.
        key = (repr(cfg.launcher), cfg.cluster.kind, cfg.job.kind, repr(getattr(cfg.job, "workdir", None)))
        if key not in codes:
            codes[key] = describe(plan_snapshot(cfg), planned=True)
        p.notes.append(codes[key])
        if slurm_reachable:
            from launcher.slurm.submit import array_key

            groups.setdefault(array_key(p.spec), []).append(p)
        else:
            note = share_note(cfg)
            if note:
                p.warnings.append(note)
    for group in groups.values():
        _ask_slurm(group)


def _ask_slurm(group: list[DryPoint]) -> None:
    """``sbatch --test-only`` for points whose scripts differ only in the run dir; a refusal is said, not enforced."""
    from launcher.slurm import cluster as slurm

    try:
        slurm.check_request(group[0].spec)  # type: ignore[arg-type]
        said, refused = f"sbatch --test-only: {slurm.test_only(group[0].spec)}", ""  # type: ignore[arg-type]
    except slurm.SlurmUnavailable as e:
        for p in group:
            p.warnings.append(f"Slurm could not be asked about this request: {e}")
            note = share_note(p.spec.cfg)  # type: ignore[union-attr]
            if note:
                p.warnings.append(note)
        return
    except (ConfigError, slurm.SlurmError) as e:
        said, refused = "", f"Slurm would refuse this request: {e}"
    for p in group:
        if said:
            p.notes.append(said)
        p.reason = p.reason or refused
