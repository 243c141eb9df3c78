"""Token loader: sharding across data-parallel ranks, resume, DALI vs the
torch fallback, and bad inputs. Shards are generated here with
scripts/prepare_tokens.py.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_data_tokens.py."""

from __future__ import annotations

from launcher.config.schema import RunConfig
from launcher.plan.make import make_plan
from train.data import dp_coords


def test_dp_coords_hsdp_layout():
    cfg = RunConfig()
    cfg.cluster.local_processes = 8
    cfg.parallelism.dp_replicate, cfg.parallelism.dp_shard, cfg.parallelism.tp = 2, 2, 2
    plan = make_plan(cfg)
    assert [dp_coords(r, plan) for r in range(8)] == [
        (0, 4),
        (0, 4),
        (1, 4),
        (1, 4),
        (2, 4),
        (2, 4),
        (3, 4),
        (3, 4),
    ]
