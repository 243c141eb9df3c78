"""Sweep points composed from a shared base equal Hydra's own composition."""

from __future__ import annotations

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.types import RunMode
from omegaconf import OmegaConf

from launcher.config.compose import CONF_DIR
from launcher.config.configstore import register
from launcher.config.sweepcompose import SweepComposer


@pytest.fixture(scope="module")
def loader_and_master():
    register()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF_DIR)))
    master = loader.load_configuration(
        config_name="config", overrides=["hydra.sweep.dir=/tmp/sweep-x"], run_mode=RunMode.MULTIRUN
    )
    return loader, master


@pytest.mark.parametrize(
    "points",
    [
        [
            ["cluster=testcluster", "model=tiny", "train.lr=0.002"],
            ["cluster=testcluster", "model=tiny", "train.lr=0.004", "model.dim=128"],
        ],
        [["model=125m", "cluster.env.NCCL_DEBUG=INFO", "parallelism.tp=2"]],
        [["+cluster.env.FOO=1", "train.lr=0.1"], ["model=tiny"]],
    ],
)
def test_fast_composition_equals_hydra(loader_and_master, points):
    loader, master = loader_and_master
    fast = SweepComposer(loader.load_sweep_config)
    for ov in points:
        want = OmegaConf.to_container(loader.load_sweep_config(master, ov), resolve=False)
        checked = fast(master, ov)  # the sweeper's check
        got = fast(master, ov)  # the launcher: the checked config, not a new composition
        assert OmegaConf.to_container(checked, resolve=False) == want
        assert OmegaConf.to_container(got, resolve=False) == want
    assert len(fast.bases) <= len(points)  # one composition per distinct group choice
