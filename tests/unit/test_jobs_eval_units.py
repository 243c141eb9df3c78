"""job=eval: a checkpoint evaluated on the batch the trainer saw next gives
the loss the training loop logged for that batch; every checkpoint of a
finished run is evaluated; eval.json in the run dir.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_jobs_eval.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan

SEQ, BATCH = 32, 8


def test_eval_on_synthetic_data_needs_a_batch_count(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "step_1").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_1" / "manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match="job.eval_batches"):
        make_plan(compose(["job=eval", f"job.checkpoint={tmp_path}"]))


def test_eval_without_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "step_5").mkdir(parents=True)  # no manifest: incomplete
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        make_plan(compose(["job=eval", f"job.checkpoint={tmp_path}", "job.eval_batches=1"]))
