"""The run spec is plain versioned JSON: it round-trips exactly, and anything
else (a pickle, another version, a wrong key or type, broken JSON) is refused
with one line, by the launcher side and by ``python -m train``."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.runfiles import SPEC_FILE
from launcher.config.spec import SPEC_VERSION, RunSpec, SpecError, load_spec, save_spec
from launcher.plan.make import make_plan


def _spec(tmp_path: Path, overrides: list[str] | None = None) -> RunSpec:
    cfg = compose(overrides or [])
    return RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path))


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["model=13b", "cluster=4node", "cluster.env.NCCL_DEBUG=INFO"],
        ["model=405b", "cluster=16node_b200"],
    ],
)
def test_round_trip_is_exact(tmp_path: Path, overrides: list[str]) -> None:
    spec = _spec(tmp_path, overrides)
    path = save_spec(spec)
    assert path.name == "spec.json"
    doc = json.loads(path.read_text())
    assert doc["version"] == SPEC_VERSION == 1
    back = load_spec(tmp_path)
    assert back == spec
    assert back.config_hash() == spec.config_hash()
    assert back.plan.tokens_per_step == spec.plan.tokens_per_step
    assert (back.plan.cost is None) == (spec.plan.cost is None)
    assert not list(tmp_path.glob("*.pkl")) and not list(tmp_path.glob("*.tmp"))


def _write(tmp_path: Path, doc: object) -> None:
    (tmp_path / SPEC_FILE).write_text(json.dumps(doc))


def _doc(tmp_path: Path) -> dict:
    return _spec(tmp_path).to_dict()


BROKEN = [
    ("version 0", lambda d: d.update(version=0), ["spec version 0", "reads version 1"]),
    ("version 2", lambda d: d.update(version=2), ["spec version 2", "reads version 1"]),
    ("no version", lambda d: d.pop("version"), ["spec version None"]),
    ("unknown top key", lambda d: d.update(extra=1), ["unknown key(s) extra"]),
    ("no plan", lambda d: d.pop("plan"), ["missing key 'plan'"]),
    ("unknown cfg key", lambda d: d["cfg"]["model"].update(bogus=1), ["cfg.model", "bogus"]),
    ("str for int", lambda d: d["cfg"]["model"].update(dim="64"), ["cfg.model.dim must be int", "'64'"]),
    ("bool for int", lambda d: d["plan"].update(tp=True), ["plan.tp must be int"]),
    ("list for dict", lambda d: d["cfg"]["cluster"].update(env=[]), ["cfg.cluster.env must be an object"]),
    ("int in env", lambda d: d["cfg"]["cluster"]["env"].update(X=1), ["cfg.cluster.env.X must be str"]),
    ("plan not object", lambda d: d.update(plan=[1]), ["plan must be an object"]),
    ("missing required", lambda d: d["plan"].pop("world_size"), ["missing key plan.world_size"]),
]


@pytest.mark.parametrize(("name", "edit", "expected"), BROKEN, ids=[b[0] for b in BROKEN])
def test_malformed_spec_is_refused(tmp_path: Path, name: str, edit, expected: list[str]) -> None:
    doc = _doc(tmp_path)
    edit(doc)
    _write(tmp_path, doc)
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path)
    for text in expected:
        assert text in str(info.value), (text, str(info.value))


def test_not_json_and_missing_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no run spec here"):
        load_spec(tmp_path)
    (tmp_path / SPEC_FILE).write_text('{"version": 1, "cfg"')
    with pytest.raises(SpecError, match="not a readable JSON spec"):
        load_spec(tmp_path)
    _write(tmp_path, [1, 2])
    with pytest.raises(SpecError, match="expected a JSON object"):
        load_spec(tmp_path)


def test_a_field_added_later_with_a_default_may_be_absent(tmp_path: Path) -> None:
    doc = _doc(tmp_path)
    del doc["cfg"]["train"]["checkpoint_at_end"]
    _write(tmp_path, doc)
    assert load_spec(tmp_path).cfg.train.checkpoint_at_end is True


def test_old_pickled_spec_is_never_unpickled(tmp_path: Path) -> None:
    """A spec.pkl whose unpickling would create a marker file: refused, not run."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    (tmp_path / "spec.pkl").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path)
    assert "spec.pkl" in str(info.value) and "older meshrun" in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize("what", ["version 2", "legacy pickle"])
def test_train_refuses_a_bad_spec_in_one_line(tmp_path: Path, what: str) -> None:
    if what == "legacy pickle":
        (tmp_path / "spec.pkl").write_bytes(pickle.dumps({"x": 1}))
        expected = "older meshrun"
    else:
        doc = _doc(tmp_path)
        doc["version"] = 2
        _write(tmp_path, doc)
        expected = "spec version 2"
    proc = subprocess.run(
        [sys.executable, "-m", "train", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "meshrun train: error:" in proc.stderr and expected in proc.stderr
    assert "Traceback" not in proc.stderr
