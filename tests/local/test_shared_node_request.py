"""Issue 53 items 7 and 8, without Slurm: a shared-node run (launcher.exclusive=false)
asks CPUs and memory in proportion to the GPUs it asks of the node's
(cluster.node_gpus), CPU work one CPU per task; and hydra/launcher=meshrun_slurm's
defaults are hydra-submitit-launcher's (one task, no exclusive node, a code
snapshot), with list overrides that parse as docs/hydra-launcher.md writes them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "tests" / "programs" / "hydra_app.py"


def _params(tmp_path: Path, *overrides: str) -> dict:
    from launcher.config.compose import compose
    from launcher.run.prepare import prepare
    from launcher.slurm.render import sbatch_parameters

    cfg = compose(["cluster=testcluster", f"launcher.runs_root={tmp_path}", *overrides])
    return sbatch_parameters(prepare(cfg, str(tmp_path / "run")))


def test_a_shared_one_gpu_run_asks_its_share_of_the_node_not_all_of_it(tmp_path: Path) -> None:
    # Finding 8: cpus-per-task=64 and mem=243GB (the whole node) for 1 GPU of 8.
    p = _params(tmp_path, "cluster.gpus_per_node=1", "launcher.exclusive=false")
    assert (p["gpus_per_node"], p["ntasks_per_node"], p["cpus_per_task"], p["mem"]) == (1, 1, 8, "30GB"), p
    assert "exclusive" not in p
    # Asked outright: kept.
    p = _params(tmp_path, "cluster.gpus_per_node=2", "launcher.exclusive=false", "launcher.cpus_per_task=3",
                "launcher.mem_gb=7")  # fmt: skip
    assert (p["ntasks_per_node"], p["cpus_per_task"], p["mem"]) == (2, 3, "7GB"), p
    # Exclusive (the presets' default): the whole node, as the golden scripts have it.
    p = _params(tmp_path, "cluster.gpus_per_node=1")
    assert (p["cpus_per_task"], p["mem"], p["exclusive"]) == (64, "243GB", True), p


def test_shared_cpu_work_asks_one_cpu_a_task_and_memory_in_proportion(tmp_path: Path) -> None:
    script = ["job=script", f"job.script={APP}", "cluster.gpus_per_node=0", "launcher.exclusive=false"]
    p = _params(tmp_path, *script)
    # No GPU option at all, one task, one CPU, 1/64 of the node's memory less headroom.
    assert (p["gpus_per_node"], p["ntasks_per_node"], p["cpus_per_task"], p["mem"]) == (None, 1, 1, "3GB"), p
    p = _params(tmp_path, *script, "launcher.cpus_per_task=4")
    assert (p["cpus_per_task"], p["mem"]) == (4, "15GB"), p


def test_node_gpus_is_in_every_slurm_preset_and_checked(tmp_path: Path) -> None:
    import yaml

    from launcher.config.validate import ConfigError

    for preset in sorted((ROOT / "conf" / "cluster").glob("*.yaml")):
        data = yaml.safe_load(preset.read_text())
        if data["kind"] == "slurm":
            assert data["node_gpus"] == data["gpus_per_node"], preset.name
    with pytest.raises(
        ConfigError, match=r"cluster.gpus_per_node=9 is invalid: must be <= cluster.node_gpus=8"
    ):
        _params(tmp_path, "cluster.gpus_per_node=9")


def _plugin_overrides(*keys: str) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from hydra_plugins.meshrun_slurm.config import MeshrunSlurmConf
    from hydra_plugins.meshrun_slurm.settings import meshrun_overrides

    conf = OmegaConf.structured(MeshrunSlurmConf(name="app"))
    for o in OverridesParser.create().parse_overrides(list(keys)):
        OmegaConf.update(conf, o.key_or_group.removeprefix("hydra.launcher."), o.value(), merge=False)
    sweep = OmegaConf.create({"hydra": {"runtime": {"cwd": "/app"}}})
    return meshrun_overrides(conf, sweep, "/task.py", ["a.pkl", "r.pkl"])


def test_the_plugins_defaults_are_submitits_one_shared_task_from_a_snapshot() -> None:
    # Finding 7: an exclusive 8-GPU node per point, 8 copies of the function, launcher.code=live.
    out = _plugin_overrides()
    assert {"cluster.gpus_per_node=0", "cluster.nodes=1", "launcher.exclusive=false"} <= set(out), out
    assert not any(o.startswith("launcher.code=") for o in out), out  # meshrun's default: snapshot
    # Asked: kept, and what overrides say comes last (wins).
    out = _plugin_overrides(
        "hydra.launcher.gpus_per_node=1", 'hydra.launcher.overrides=["launcher.code=live"]'
    )
    assert "cluster.gpus_per_node=1" in out and out[-1] == "launcher.code=live", out


def test_the_docs_list_overrides_parse_in_hydras_grammar() -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    docs = (ROOT / "docs" / "hydra-launcher.md").read_text()
    written = re.findall(r"'(hydra\.launcher\.overrides=\[[^`]*\])'", docs)
    assert written, "docs/hydra-launcher.md shows an overrides example"
    for text in written:
        (o,) = OverridesParser.create().parse_overrides([text])
        assert all("=" in v for v in o.value()), (text, o.value())


def test_wait_false_refuses_a_sweeper_that_needs_results() -> None:
    from omegaconf import OmegaConf

    from hydra_plugins.meshrun_slurm.launcher import BASIC_SWEEPER, check_no_wait
    from launcher.config.validate import ConfigError

    check_no_wait(OmegaConf.create({"hydra": {"sweeper": {"_target_": BASIC_SWEEPER}}}))
    optuna = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    with pytest.raises(
        ConfigError, match=r"^hydra.launcher.wait=False is invalid: the sweeper .*OptunaSweeper"
    ):
        check_no_wait(OmegaConf.create({"hydra": {"sweeper": {"_target_": optuna}}}))
