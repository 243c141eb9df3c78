"""Plain-text views of a Prediction (the dry run and the predict CLI)."""

from __future__ import annotations

from launcher.perf.steptime import Prediction

BREAKDOWN_LABELS = {
    "compute": "compute",
    "fsdp": "FSDP comm (exposed)",
    "hsdp": "HSDP all-reduce (exposed)",
    "tp": "TP comm",
    "pp_p2p": "PP send/recv (exposed)",
    "pp_bubble": "PP bubble",
    "data": "data-loader stall",
    "checkpoint": "checkpoint stall",
    "overhead": "fixed per-step overhead",
}


def format_prediction(pred: Prediction, tokens: float = 0.0) -> list[tuple[str, str]]:
    """(label, value) rows: headline figures, then the step breakdown."""
    rows = [
        ("step time", f"{pred.step_time_s:.3g} s (+/-{pred.uncertainty_pct:.0f}%)"),
        ("tokens/s", f"{pred.tokens_per_s:,.0f} total, {pred.tokens_per_s_per_gpu:,.0f} per GPU"),
        ("MFU", f"{pred.mfu:.1%} (HFU {pred.hfu:.1%}, peak {pred.peak_tflops:g} TFLOP/s)"),
    ]
    if tokens:
        rows.append((f"time for {tokens:.3g} tokens", f"{pred.hours_for(tokens):,.1f} h"))
    for key, label in BREAKDOWN_LABELS.items():
        v = pred.breakdown.get(key, 0.0)
        if v > 0:
            rows.append((f"  {label}", f"{v:.3g} s ({v / pred.step_time_s:.0%})"))
    for dim, total in pred.comm_total_s.items():
        if total > 0:
            rows.append((f"  {dim} comm total (hidden + exposed)", f"{total:.3g} s"))
    if pred.device_source:
        rows.append(("device constants", pred.device_source))
    for n in pred.notes:
        rows.append(("note", n))
    return rows


def format_text(pred: Prediction, tokens: float = 0.0) -> str:
    rows = format_prediction(pred, tokens)
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)
