"""Cost: the perf model's throughput, the seed's price table, CLI and chart."""

from __future__ import annotations

import pytest

from launcher.commands import cost
from launcher.config.compose import compose
from launcher.perf import predict
from launcher.perf.pricing import estimate_cost
from launcher.plan.make import make_plan

# The seed article's table (per configuration): on-demand/hr, reserved/yr, on-prem 3y.
SEED_PRICES = {
    "1node_a100": (148, 425e3, 280e3),
    "1node": (180, 520e3, 350e3),
    "4node": (720, 2.1e6, 1.4e6),
    "8node": (1440, 4.2e6, 2.8e6),
    "16node_b200": (4800, 14e6, 9.5e6),
}


def test_estimate_cost_uses_the_perf_model():
    cfg = compose(["cluster=4node", "model=13b", "train.target_tokens=1e9"])
    plan = make_plan(cfg)
    k = estimate_cost(cfg, plan)
    pred = predict(cfg, plan)
    assert k.basis == "perf model"
    assert k.tokens_per_s_per_gpu == pytest.approx(pred.tokens_per_s_per_gpu)
    assert k.hours == pytest.approx(1e9 / pred.tokens_per_s / 3600)
    assert k.usd_on_demand == pytest.approx(k.hours * 4 * 180)
    fixed = estimate_cost(cfg, plan, mfu=0.4)
    assert fixed.basis == "fixed MFU" and fixed.mfu == 0.4
    assert estimate_cost(compose([]), make_plan(compose([]))) is None  # CPU run: no price


def test_presets_reproduce_seed_price_table():
    rows = cost.compare_presets(list(SEED_PRICES), ["model=13b"], 1e10, 2)
    for r in rows:
        od, res, onprem = SEED_PRICES[r.preset]
        assert r.on_demand_usd_per_hour == pytest.approx(od)
        assert r.reserved_usd_per_year == pytest.approx(res, rel=0.01)
        assert r.onprem_usd_3yr == pytest.approx(onprem, rel=0.01)
    rel = {r.preset: r.relative for r in rows}
    assert rel["1node_a100"] == 1.0
    assert rel["1node_a100"] < rel["1node"] < rel["4node"] < rel["8node"] < rel["16node_b200"]
    table = cost.format_table(rows, 1e10)
    assert "$148" in table and "$2.1M" in table and "$14.0M" in table


def test_cli_table_and_png(tmp_path, capsys):
    png = tmp_path / "cost.png"
    rc = cost.main(["--clusters", "1node_a100,1node", "--scaling-nodes", "1,2", "--png", str(png)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "1node_a100" in out and "seed thrpt" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_bad_preset(capsys):
    assert cost.main(["--clusters", "nosuch"]) == 2
    assert "nosuch" in capsys.readouterr().err


def test_predict_sweep_table(capsys):
    from launcher.commands import predict as cli

    points = cli.expand(["cluster=1node,2node,4node,8node", "model=13b"], True)
    assert len(points) == 4 and points[2] == ["cluster=4node", "model=13b"]
    assert cli.main(["-m", "cluster=1node,2node,4node,8node", "model=13b"]) == 0
    out = capsys.readouterr().out
    for name in ("cluster=1node", "cluster=2node", "cluster=4node", "cluster=8node"):
        assert name in out
    assert cli.main(["cluster=4node", "model=13b", "--tokens", "1e9"]) == 0
    assert "time for 1e+09 tokens" in capsys.readouterr().out


def test_spare_nodes_are_priced_beside_the_training_nodes():
    """The job holds its spares for its whole life, and Slurm bills them."""
    cfg = compose(["cluster=4node", "model=13b", "train.target_tokens=1e9", "cluster.spare_nodes=1"])
    plan = make_plan(cfg)
    k = estimate_cost(cfg, plan)
    bare = estimate_cost(compose(["cluster=4node", "model=13b", "train.target_tokens=1e9"]), plan)
    assert k.hours == pytest.approx(bare.hours)  # the spare trains nothing
    assert k.usd_on_demand == pytest.approx(k.hours * 5 * 180) and k.spare_nodes == 1
    from launcher.views.planreport import cost_line

    assert "1 spare node(s) included" in cost_line(k) and "spare" not in cost_line(bare)
