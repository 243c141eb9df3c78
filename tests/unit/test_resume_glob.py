"""job.resume_from is globbed by every task's wrapper: a pattern pathlib cannot
read is refused at validation, naming the field, never in the tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.scriptjob import newest_match, resume_pattern_problem
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan

TOY = Path(__file__).resolve().parents[1] / "programs" / "ddp_toy.py"


@pytest.mark.parametrize(
    ("pattern", "said"),
    [
        ("out/**checkpoint-*/x", "'**' can only be an entire path component"),
        ("/", "names no file"),
        (".", "names no file"),
    ],
)
def test_bad_resume_glob_refused_at_validation(pattern: str, said: str) -> None:
    cfg = compose(
        [
            "job=script",
            f"job.script={TOY}",
            f"job.resume_from={pattern}",
            'job.resume_args=["--resume","{path}"]',
        ]
    )
    with pytest.raises(ConfigError) as e:
        make_plan(cfg)
    assert f"job.resume_from={pattern!r}" in str(e.value) and said in str(e.value)


def test_good_resume_glob_passes_and_picks_the_newest(tmp_path: Path) -> None:
    assert resume_pattern_problem("out/checkpoint-*/trainer_state.json") is None
    for n in (9, 10, 2):
        (tmp_path / "out" / f"checkpoint-{n}").mkdir(parents=True)
    assert newest_match("out/checkpoint-*", tmp_path) == str(tmp_path / "out" / "checkpoint-10")
