"""A sweep's dry run (``python -m launcher -m ... launcher.dry_run=true``):
one table with a row per point (swept values, layout, memory, speed, cost,
valid or why not), each distinct warning and refusal once, nothing written;
``-v`` prints every point's full plan and sbatch script as before.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_sweep_dry_run.py."""

from __future__ import annotations

from launcher.commands.run import verbose_flag
from launcher.views.planreport import swept_keys
from launcher.views.sweepdry import short_reason


def test_swept_keys_and_short_reasons() -> None:
    points = [["model=tiny", "train.lr=0.1", "cluster=1node"], ["model=1b", "train.lr=0.1", "cluster=1node"]]
    assert swept_keys(points) == ["model"]
    assert swept_keys([["a=1"], ["a=1", "b=2"]]) == ["b"]  # a key one point lacks differs
    assert swept_keys([["a=1", "b=2"]]) == ["a", "b"]  # nothing differs: every key
    assert short_reason("model=1b does not fit: 21.1 GB per CPU rank, but ...") == "model=1b does not fit"
    assert short_reason("In 'config': Could not find 'model/bogus' Available options in 'model': 1b") == (
        "Could not find 'model/bogus'"
    )
    assert len(short_reason("x" * 200)) == 50


def test_verbose_flag_is_an_override() -> None:
    assert verbose_flag(["-m", "-v", "model=tiny"]) == ["-m", "model=tiny", "launcher.verbose=true"]
    assert verbose_flag(["--verbose"]) == ["launcher.verbose=true"]
    assert verbose_flag(["model=tiny"]) == ["model=tiny"]
