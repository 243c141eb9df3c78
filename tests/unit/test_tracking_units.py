"""Run tracking (train/observe/tracking.py) from a real local run: TensorBoard event
files read back with TensorBoard's own reader, and the W&B offline run
directory, hold the values the run logged to metrics.jsonl.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_tracking.py."""

from __future__ import annotations

import pytest

from launcher.config.compose import compose
from launcher.config.validate import ConfigError, validate


def test_wandb_mode_is_checked() -> None:
    with pytest.raises(
        ConfigError, match=r"train.wandb='cloud' is invalid: choose one of off, online, offline"
    ):
        validate(compose(["train.wandb=cloud"]))
    validate(compose(["train.wandb=offline"]))  # installed here (the test extra)


def test_wandb_asked_for_but_not_installed_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"train.wandb='online' is invalid: .*pip install wandb"):
        validate(compose(["train.wandb=online"]))
