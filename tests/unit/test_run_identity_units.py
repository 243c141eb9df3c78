"""Run identity (launcher/config/runid.py): every run has its own id, kept in its run
directory, and every location it shares with other runs is named by it.
A reused run dir resumes its own run only, and a changed training config is
refused unless launcher.resume=force.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_run_identity.py."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.runid import RUN_ID_FILE, claim_run_id, new_run_id, read_run_id
from launcher.config.spec import RunSpec, load_spec, save_spec
from launcher.plan.make import make_plan
from launcher.run.rundir import config_changes

ID_RE = re.compile(r"^tiny-local-\d{8}T\d{6}Z-[0-9a-f]{4}$")


def test_ids_of_the_same_second_differ_and_are_readable() -> None:
    ids = {new_run_id("13b-4node", now=1_800_000_000.0) for _ in range(50)}
    assert len(ids) > 45  # 4 hex digits: a same-second collision is a 1-in-65536 event per pair
    one = next(iter(ids))
    assert re.fullmatch(r"13b-4node-20270115T080000Z-[0-9a-f]{4}", one), one
    # Names are reduced to characters safe in paths, S3 keys and job names.
    assert new_run_id("my run/../x", now=0).startswith("my-run-..-x-19700101T000000Z-")


def test_claim_keeps_the_run_dirs_id(tmp_path: Path) -> None:
    first = claim_run_id(tmp_path / "run", "tiny-local")
    assert ID_RE.match(first) and read_run_id(tmp_path / "run") == first
    assert claim_run_id(tmp_path / "run", "other") == first
    assert sorted(os.listdir(tmp_path / "run")) == [RUN_ID_FILE]  # no temp file left


def test_save_spec_gives_the_id_and_load_keeps_it(tmp_path: Path) -> None:
    cfg = compose([])
    spec = RunSpec(cfg, make_plan(cfg), str(tmp_path / "r"))
    save_spec(spec)
    assert ID_RE.match(spec.run_id) and read_run_id(tmp_path / "r") == spec.run_id
    assert load_spec(tmp_path / "r").run_id == spec.run_id
    again = RunSpec(cfg, make_plan(cfg), str(tmp_path / "r"))
    save_spec(again)  # a restart of the same dir: same run
    assert again.run_id == spec.run_id


def test_tiers_are_named_by_the_run_id(tmp_path: Path) -> None:
    from train.checkpoint.tiers import local_root, run_name

    cfg = compose([f"storage.local_dir={tmp_path / 'nvme'}"])
    a = RunSpec(cfg, make_plan(cfg), str(tmp_path / "x" / "0"))
    b = RunSpec(cfg, make_plan(cfg), str(tmp_path / "y" / "0"))  # same basename, another run
    with pytest.raises(ValueError, match="no run id"):
        run_name(a)
    save_spec(a)
    save_spec(b)
    assert run_name(a) == a.run_id != run_name(b) == b.run_id
    assert local_root(a) == str(tmp_path / "nvme" / a.run_id) == a.checkpoint_dir


def test_config_changes_name_training_fields_only() -> None:
    import dataclasses

    old = dataclasses.asdict(compose(["train.steps=10"]))
    same = dataclasses.asdict(
        compose(
            [
                "train.steps=99",
                "train.log_every_steps=1",
                "train.wandb=offline",
                "data.num_workers=0",
                "storage.keep_local=5",
                "cluster.local_processes=1",
            ]
        )
    )
    assert config_changes(old, same) == []
    changed = dataclasses.asdict(compose(["train.lr=0.01", "model.dim=128"]))
    assert config_changes(old, changed) == ["model.dim: 64 -> 128", "train.lr: 0.003 -> 0.01"]


def test_slurm_job_name_is_the_run_id_and_arrays_group_points() -> None:
    from launcher.slurm.render import sbatch_parameters
    from launcher.slurm.submit import array_key

    cfg = compose(["cluster=testcluster"])
    a = RunSpec(cfg, make_plan(cfg), "/runs/s/0", run_id="tiny-testcluster-20261201T000000Z-aaaa")
    b = RunSpec(cfg, make_plan(cfg), "/runs/s/1", run_id="tiny-testcluster-20261201T000000Z-bbbb")
    assert sbatch_parameters(a)["job_name"] == a.run_id
    assert array_key(a) == array_key(b)  # one array: scripts differ only by run dir and id
