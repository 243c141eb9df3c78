"""The verify_parallel matrix under pytest: each layout, trained through the
launcher's local path, matches a single-process run of the same model, seed
and data over 5 optimizer steps (fp32 1e-5, bf16 2e-3 vs a bf16 single
process, compiled 1e-4). The --quick subset always runs; the rest is marked
slow (still run in CI), but for the rows only the campaign runs (pytest -m campaign)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Test harnesses (the layout matrix, the checkpoint drill) live in scripts/.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from parallel_layouts import LAYOUTS, REFERENCE, REFERENCE_BF16, Outcome, compare, format_row, run_layout

# Campaign only (pytest -m campaign, and scripts/verify_parallel.py), to keep
# CI's time on 2 cores: each is covered in kind by a row that stays (pp x dp
# by pp x dp x tp, full AC by selective AC, TP bf16 by FSDP bf16, FSDP-only
# and TP-only compiled by dp x tp compiled).
CAMPAIGN_ONLY = {
    "pp2_dp2",
    "fsdp2_ac_full",
    "dp2_tp2_bf16",
    "fsdp2_compiled",
    "tp2_compiled",
    "dp2_tp2_sac_compiled",
}


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("verify")
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(path)  # rank processes' temp files stay here
    yield str(path)
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old


@pytest.fixture(scope="module")
def references(work_dir) -> dict[str, Outcome]:
    return {}


def _reference(references: dict[str, Outcome], kind: str, work_dir: str) -> Outcome:
    if kind not in references:
        ref = run_layout(REFERENCE_BF16 if kind == "bf16" else REFERENCE, work_dir)
        assert not ref.error, ref.error
        references[kind] = ref
    return references[kind]


def _params():
    for lay in LAYOUTS:
        marks = (
            (pytest.mark.campaign,) if lay.name in CAMPAIGN_ONLY else () if lay.quick else (pytest.mark.slow,)
        )
        yield pytest.param(lay, id=lay.name, marks=marks)


@pytest.mark.parametrize("layout", list(_params()))
def test_layout_matches_single_process(layout, references, work_dir) -> None:
    ref = _reference(references, "bf16" if layout.kind == "bf16" else "fp32", work_dir)
    out = run_layout(layout, work_dir)
    compare(out, ref)
    assert out.passed, format_row(out)
    assert len(out.losses) == 5 and out.loss_diff >= 0.0


def test_bf16_reference_differs_from_fp32(references, work_dir) -> None:
    """The bf16 reference really runs in bf16 (else the bf16 rows would
    compare fp32 with fp32 and prove nothing)."""
    fp32 = _reference(references, "fp32", work_dir)
    bf16 = _reference(references, "bf16", work_dir)
    gap = max(abs(a - b) for a, b in zip(fp32.losses, bf16.losses, strict=True))
    assert 1e-5 < gap < 2e-2, gap
