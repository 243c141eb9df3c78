"""A run dir that holds a run continues that run: its saved config is the base,
what the user typed goes on top, and another program is refused before
anything is written (issue: one run, one record)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from launcher.config.compose import compose
from launcher.config.runfiles import CONFIG_FILE
from launcher.config.validate import ConfigError
from launcher.run.continuation import continued_config, typed_keys

TOY = Path(__file__).resolve().parents[1] / "programs" / "ddp_toy.py"


def _saved(run_dir: Path, overrides: list[str]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = compose([*overrides, f"launcher.run_dir={run_dir}"])
    (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))


def test_run_dir_alone_continues_with_the_saved_config(tmp_path: Path) -> None:
    run = tmp_path / "run"
    script = ["job=script", f"job.script={TOY}", "job.args=[--steps,6]", "cluster.local_processes=3"]
    _saved(run, script)
    typed = [f"launcher.run_dir={run}"]
    cfg = continued_config(compose(typed), run, typed)
    assert cfg.job.kind == "script" and cfg.job.script == str(TOY) and cfg.job.args == ["--steps", "6"]
    assert cfg.cluster.local_processes == 3 and cfg.launcher.run_dir == str(run)
    # A field typed on top changes what it names, nothing else.
    typed = [f"launcher.run_dir={run}", "qos.time_limit_min=90"]
    cfg = continued_config(compose(typed), run, typed)
    assert cfg.qos.time_limit_min == 90 and cfg.job.kind == "script" and cfg.cluster.local_processes == 3


@pytest.mark.parametrize(
    ("typed", "said"),
    [
        (["job=pretrain"], "job.kind: 'script' -> 'pretrain'"),
        (["job.args=[--steps,9,--lr,1]"], "job.args: ['--steps', '6'] -> ['--steps', '9', '--lr', '1']"),
        (["job.launch=torchrun"], "job.launch: 'tasks' -> 'torchrun'"),
    ],
)
def test_another_program_is_refused_naming_both(tmp_path: Path, typed: list[str], said: str) -> None:
    run = tmp_path / "run"
    _saved(run, ["job=script", f"job.script={TOY}", "job.args=[--steps,6]"])
    before = sorted(p.name for p in run.iterdir())
    typed = [f"launcher.run_dir={run}", *typed]
    with pytest.raises(ConfigError) as e:
        continued_config(compose(typed), run, typed)
    assert said in str(e.value) and "new run dir" in str(e.value)
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written


def test_a_new_run_dir_is_the_composed_config(tmp_path: Path) -> None:
    cfg = compose(["train.steps=7"])
    assert continued_config(cfg, tmp_path / "none", ["train.steps=7"]) is cfg


def test_an_unreadable_older_config_is_refused_naming_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / CONFIG_FILE).write_text(yaml.safe_dump({"job": {"kind": "pretrain"}, "trainer": {"old": 1}}))
    typed = [f"launcher.run_dir={run}"]
    with pytest.raises(ConfigError, match="written by another meshrun version"):
        continued_config(compose(typed), run, typed)
    # launcher.resume=force: resumed with the config as typed.
    typed.append("launcher.resume=force")
    cfg = compose(typed)
    assert continued_config(cfg, run, typed) is cfg


def test_typed_keys() -> None:
    assert typed_keys(["model=13b", "+train.x=1", "hydra.run.dir=x", "~qos.qos", "cluster.env.A=1"]) == [
        "model",
        "train.x",
        "cluster.env.A",
    ]
