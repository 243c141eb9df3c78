"""Units of the straggler watch without Slurm (launcher/selfheal/straggler.py): the
rule (peers' median, threshold, window, probes after a save not counted, a
node by its worst rank), the trainer's probe in the heartbeat, the scores
served to Prometheus, `meshrun nodes` showing a score, and refusals of the
fields. The cluster scenario is in tests/cluster/test_selfheal.py.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_straggler.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.schema import LauncherConfig
from launcher.selfheal.straggler import StragglerWatch, rank_verdicts, ratios, write_scores


def _hbs(times: dict[int, list[float]], saves: set[int] = frozenset(), every: int = 2) -> dict:
    """Heartbeats of ranks 0..3 (nodes a: 0,1; b: 2,3) with probes at steps every, 2*every, ..."""
    return {
        r: {
            "rank": r,
            "node": "a" if r < 2 else "b",
            "probes": [[every * (i + 1), t, every * (i + 1) in saves] for i, t in enumerate(ts)],
        }
        for r, ts in times.items()
    }


def test_ratio_is_over_the_median_of_the_peers() -> None:
    by_step = ratios(
        {0: {2: (0.01, False)}, 1: {2: (0.01, False)}, 2: {2: (0.02, False)}, 3: {2: (0.03, False)}}, 4
    )
    assert by_step[2][3] == pytest.approx(0.03 / 0.01)  # peers 0.01, 0.01, 0.02
    assert by_step[2][0] == pytest.approx(0.01 / 0.02)  # peers 0.01, 0.02, 0.03
    # A step not every rank reported, or one world of one: no ratio.
    assert ratios({0: {2: (0.01, False)}, 1: {4: (0.01, False)}}, 2) == {}
    assert ratios({0: {2: (0.01, False)}}, 1) == {}


def test_rule_threshold_window_and_min_slow() -> None:
    by_step = {s: {0: 1.0, 1: x} for s, x in zip(range(1, 7), [1.0, 1.5, 1.5, 1.2, 1.5, 1.5], strict=True)}
    v = rank_verdicts(by_step, threshold=1.3, window=5, min_slow=4)
    assert v[1] == {
        "slow": 4,
        "window": 5,
        "probe_steps": [2, 3, 4, 5, 6],
        "score": 1.5,
        "straggler": True,
    }  # steps 2-6: 1.5 1.5 1.2 1.5 1.5
    assert not v[0]["straggler"] and v[0]["slow"] == 0
    assert not rank_verdicts(by_step, threshold=1.3, window=5, min_slow=5)[1]["straggler"]
    assert not rank_verdicts(by_step, threshold=1.5, window=5, min_slow=1)[1]["straggler"]  # "over", not "at"
    # A window not yet full flags nothing.
    assert not rank_verdicts(by_step, threshold=1.3, window=7, min_slow=1)[1]["straggler"]


def test_watch_flags_a_node_once_ignoring_probes_after_a_save() -> None:
    lc = LauncherConfig(straggler_threshold=1.3, straggler_window=3, straggler_min_slow=3)
    w = StragglerWatch(lc, 4)
    fast, slow = [0.010] * 4, [0.010, 0.025, 0.024, 0.026]  # rank 3 slow from the 2nd probe (step 4)
    # Step 4's probe came right after a save: dropped for every rank, so 3 slow ones are not yet counted.
    nodes, new = w.observe(_hbs({0: fast, 1: fast, 2: fast, 3: slow}, saves={4}))
    assert new == [] and nodes["b"]["verdicts"][3]["slow"] == 2 and nodes["b"]["verdicts"][3]["window"] == 3
    nodes, new = w.observe(
        _hbs({0: fast + [0.01], 1: fast + [0.01], 2: fast + [0.01], 3: slow + [0.03]}, {4})
    )
    assert [n["node"] for n in new] == ["b"] and new[0]["ranks"] == [3]
    assert new[0]["verdicts"][3]["probe_steps"] == [6, 8, 10]
    assert new[0]["score"] == pytest.approx(2.6)  # steps 6, 8, 10: 2.4, 2.6, 3.0 (step 4 dropped)
    assert nodes["a"]["ranks"] == [] and nodes["a"]["score"] < 1.3
    _, again = w.observe(_hbs({0: fast + [0.01], 1: fast + [0.01], 2: fast + [0.01], 3: slow + [0.03]}))
    assert again == []  # once per attempt
    # Junk in a heartbeat's probes is skipped, not fatal.
    assert w.observe({0: {"node": "a", "probes": [["x"], None, [1]]}})[1] == []


def test_probe_in_the_heartbeat_and_scores_served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from launcher.config.health import read_heartbeats
    from train.observe import heartbeat
    from train.observe.metrics import StragglerCollector
    from train.observe.probe import SoloProbe

    monkeypatch.setenv("MESHRUN_ATTEMPT", "0.0")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("MESHRUN_NODE_HEARTBEAT_DIR", str(tmp_path / "local"))
    monkeypatch.setattr(heartbeat, "_run_dir", None)
    monkeypatch.setattr(heartbeat, "_writer", None)
    monkeypatch.setattr(heartbeat, "_probes", type(heartbeat._probes)(maxlen=heartbeat.PROBES_KEPT))
    heartbeat.start(str(tmp_path))
    try:
        heartbeat.beat("step", 6)
        p = SoloProbe(3, "cpu")
        p.maybe(5)  # not a probe step
        p.saved_at = 5
        p.maybe(6)
        heartbeat.beat("step", 7)
        heartbeat._writer.flush()  # the node file as the node's writer rewrites it each second
        h = read_heartbeats(tmp_path)[1]
        assert h["phase"] == "step" and h["step"] == 7
        ((step, seconds, after_save),) = h["probes"]
        assert step == 6 and seconds > 0 and after_save is True
    finally:
        if heartbeat._writer is not None:
            heartbeat._writer.stop()
        monkeypatch.setattr(heartbeat, "_run_dir", None)
    write_scores(str(tmp_path), "0.0", {"a": {"score": 1.0}, "b": {"score": 2.5}}, {"b"})
    reg = CollectorRegistry()
    reg.register(StragglerCollector(tmp_path, {"run": "r", "job_id": "7"}))
    text = generate_latest(reg).decode()
    assert 'meshrun_straggler_score{job_id="7",run="r",straggler_node="b"} 2.5' in text
    assert 'meshrun_straggler_flagged{job_id="7",run="r",straggler_node="b"} 1.0' in text
    assert 'meshrun_straggler_flagged{job_id="7",run="r",straggler_node="a"} 0.0' in text
