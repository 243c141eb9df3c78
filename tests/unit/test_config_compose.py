"""Every option of every config group composes and plans against the defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.compose import CONF_DIR, compose
from launcher.config.schema import GROUPS
from launcher.plan.make import make_plan


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


HF_TINY = Path(__file__).parent.parent / "data" / "hf_tiny"
# Options that need a companion override to be a valid run on their own.
COMPANIONS = {
    ("storage", "nvme_s3"): ["storage.s3_bucket=ckpts"],
    ("storage", "nvme_lustre_s3"): ["storage.s3_bucket=ckpts"],
    ("data", "images"): ["model=vit_tiny"],
    # A config.json (no weights), tokenizer.json and prompts: enough to plan.
    ("model", "hf"): ["job=finetune", f"job.hf_path={HF_TINY}"],
    ("job", "finetune"): ["model=hf", f"job.hf_path={HF_TINY}"],
    ("job", "eval"): ["model=hf", f"job.hf_path={HF_TINY}", "job.eval_batches=1"],
    ("job", "generate"): ["model=hf", f"job.hf_path={HF_TINY}", f"job.prompts={HF_TINY}/prompts.jsonl"],
    ("job", "script"): [f"job.script={Path(__file__).parent.parent / 'programs' / 'ddp_toy.py'}"],
}


def companions(group: str, option: str) -> list[str]:
    extra = COMPANIONS.get((group, option), [])
    if group == "model" and option.startswith("vit"):
        extra = ["data=images"]
    return extra


CASES = [(g, o) for g in GROUPS for o in options(g)]


@pytest.mark.parametrize(("group", "option"), CASES, ids=[f"{g}={o}" for g, o in CASES])
def test_every_option_composes_and_plans(group: str, option: str) -> None:
    overrides = [f"{group}={option}", *companions(group, option)]
    # Big models need a cluster; small ones plan on the default local one.
    if group == "model" and option in ("70b", "405b"):
        overrides.append("cluster=16node_b200")
    elif group == "model" and option in ("1b", "7b", "8b", "13b"):  # 1b: over a 24 GB host's RAM
        overrides.append("cluster=4node")
    elif group == "parallelism" and option in ("fsdp_tp", "fsdp_tp_pp"):
        overrides += ["model=13b" if option == "fsdp_tp" else "model=70b", "cluster=4node"]
    cfg = compose(overrides)
    assert getattr(cfg, group).name == option
    plan = make_plan(cfg)
    assert plan.dp_replicate * plan.dp_shard * plan.tp * plan.pp == plan.world_size
    assert plan.memory.fits


def test_each_group_has_options() -> None:
    for group in GROUPS:
        assert options(group), group


def test_defaults_are_the_local_tiny_run() -> None:
    cfg = compose()
    assert (cfg.cluster.name, cfg.model.name, cfg.data.name) == ("local", "tiny", "synthetic")
    plan = make_plan(cfg)
    assert (plan.device, plan.backend, plan.world_size, plan.mode) == ("cpu", "gloo", 2, "fsdp")


def test_guidance_small_medium_large() -> None:
    small = make_plan(compose(["model=1b", "cluster=1node"]))
    assert (small.mode, small.tp, small.pp) == ("fsdp", 1, 1)
    medium = make_plan(compose(["model=13b", "cluster=4node"]))
    assert (medium.tp, medium.pp) == (8, 1)
    # Across nodes: shard inside a node, replicate across nodes.
    hsdp = make_plan(compose(["model=1b", "cluster=4node"]))
    assert (hsdp.dp_shard, hsdp.dp_replicate) == (8, 4)
    large = make_plan(compose(["model=405b", "cluster=16node_b200"]))
    assert large.pp > 1 and large.tp == 8 and large.world_size >= 32


def test_memory_drives_sharding_and_checkpointing() -> None:
    # 70B with TP 8 cannot replicate across 4 nodes: it must shard wider.
    plan = make_plan(compose(["model=70b", "cluster=4node"]))
    assert plan.dp_shard > 1
    assert plan.memory.total_gb <= 80
    assert plan.memory.activations_no_ac_gb >= plan.memory.activations_gb


def test_explicit_degrees_are_respected() -> None:
    plan = make_plan(compose(["cluster.local_processes=4", "parallelism.tp=2", "parallelism.dp_shard=2"]))
    assert (plan.tp, plan.dp_shard, plan.dp_replicate) == (2, 2, 1)
    assert plan.mode == "fsdp_tp"


def test_cost_scales_with_nodes_and_prices() -> None:
    one = make_plan(compose(["model=7b", "cluster=1node", "train.target_tokens=1e9"])).cost
    four = make_plan(compose(["model=7b", "cluster=4node", "train.target_tokens=1e9"])).cost
    assert one is not None and four is not None
    assert one.tokens == four.tokens == 1e9
    assert four.hours < one.hours
    # Reserved is cheaper per hour than on-demand, on-prem TCO cheaper still.
    assert one.usd_onprem < one.usd_reserved < one.usd_on_demand


def test_run_config_converted_in_place_equals_the_whole_tree_converted(tmp_path: Path) -> None:
    """to_run_config converts group by group (no copy of the tree, Hydra's
    keys included, per sweep point): the same RunConfig as converting a copy
    without ``hydra``, for every option of every group; config.yaml (libyaml)
    is OmegaConf's own YAML of it; a stray top-level key is refused."""
    import dataclasses

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from launcher.config.compose import to_run_config
    from launcher.config.configstore import register
    from launcher.config.image_ref import resolve_image
    from launcher.config.runfiles import CONFIG_FILE
    from launcher.config.spec import RunSpec
    from launcher.config.validate import ConfigError
    from launcher.run.rundir import write_run_dir

    register()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        for group, option in CASES:
            ov = [f"{group}={option}", *companions(group, option), "model.dim=96", "train.lr=0.003"]
            cfg = hydra_compose(config_name="config", overrides=ov, return_hydra_config=True)
            whole = cfg.copy()
            OmegaConf.set_struct(whole, False)
            whole.pop("hydra")
            want = OmegaConf.to_object(whole)
            want.cluster.container_image = resolve_image(want.cluster.container_image)
            got = to_run_config(cfg)
            assert got == want, ov
            assert "hydra" in cfg and got.model.dim == 96 and got.train.lr == 0.003
        stray = hydra_compose(config_name="config", return_hydra_config=True)
    obj = to_run_config(stray)
    write_run_dir(RunSpec(obj, make_plan(obj), str(tmp_path / "run")))
    assert (tmp_path / "run" / CONFIG_FILE).read_text() == OmegaConf.to_yaml(OmegaConf.structured(obj))
    assert dataclasses.asdict(obj) == OmegaConf.to_container(OmegaConf.structured(obj))
    OmegaConf.set_struct(stray, False)
    stray.bogus = 1
    with pytest.raises(ConfigError, match=r"unknown top-level key\(s\) \['bogus'\]; valid: \['cluster'"):
        to_run_config(stray)
