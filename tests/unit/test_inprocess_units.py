"""In-process recovery's pure parts: the partner pairing, the step every
needed copy holds (a partner pair lost: none, so the durable checkpoint),
and the refusals of launcher.in_process_recovery naming the field."""

from __future__ import annotations

import pytest

from launcher.config.schema import (
    ClusterConfig,
    JobConfig,
    ModelConfig,
    ParallelismConfig,
    RunConfig,
    TrainConfig,
)
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan
from train.inprocess.peerstate import agreed_step, holder_of, partner_offset


def test_partners_sit_one_node_over() -> None:
    assert partner_offset(8, 4, 2) == 4  # 2 nodes x 4: rank r's copy on the other node
    assert partner_offset(4, 4, 1) == 2  # cluster=local: half the ranks over, as 2 nodes x 2
    assert [holder_of(r, 16, partner_offset(16, 4, 4)) for r in (0, 3, 12, 15)] == [4, 7, 0, 3]
    with pytest.raises(ValueError, match="no partner"):
        partner_offset(1, 1, 1)


def test_the_newest_step_every_needed_copy_holds() -> None:
    # (own steps, held steps) per rank; rank 2 replaced (holds nothing); its holder is rank 0.
    everyone = [([9, 10], [9, 10]), ([9, 10], [9, 10]), ([], []), ([9, 10], [9, 10])]
    assert agreed_step(everyone, 2) == (10, [2])
    # A fault during an exchange: rank 0 did not receive rank 2's copy of step 10 yet.
    everyone[0] = ([9, 10], [8, 9])
    assert agreed_step(everyone, 2) == (9, [2])
    # Ranks 0 and 2 lost at once: each held the other's copy -> the durable checkpoint.
    assert agreed_step([([], []), ([9], [9]), ([], []), ([9], [9])], 2) == (None, [0, 2])
    # Ranks 0 and 1 lost: their copies are on ranks 2 and 3.
    assert agreed_step([([], []), ([], []), ([4, 5], [4, 5]), ([5], [5])], 2) == (5, [0, 1])


def _cfg(**kw) -> RunConfig:  # type: ignore[no-untyped-def]
    cfg = RunConfig(
        cluster=ClusterConfig(local_processes=4),
        model=ModelConfig(name="tiny", dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_dim=64, seq_len=16),
        train=TrainConfig(global_batch_size=4, steps=10),
        **kw,
    )
    cfg.launcher.in_process_recovery = True
    return cfg


def test_refusals_name_the_field() -> None:
    assert make_plan(_cfg()).world_size == 4  # data parallel on 4 ranks: accepted
    with pytest.raises(ConfigError, match=r"parallelism\.tp=2 .*data-parallel layouts only"):
        make_plan(_cfg(parallelism=ParallelismConfig(tp=2)))
    cfg = _cfg()
    cfg.cluster.local_processes = 1
    with pytest.raises(ConfigError, match=r"launcher\.in_process_recovery.*at least 2 ranks"):
        make_plan(cfg)
    with pytest.raises(ConfigError, match=r"launcher\.in_process_recovery.*job\.kind=eval"):
        make_plan(_cfg(job=JobConfig(kind="eval")))
    cfg = _cfg()
    cfg.launcher.peer_copy_every_steps = 0
    with pytest.raises(ConfigError, match=r"launcher\.peer_copy_every_steps"):
        make_plan(cfg)
