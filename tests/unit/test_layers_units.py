"""The shape of the code stays as docs/ARCHITECTURE.md draws it: no import
circle, no upward import between launcher's layers or train/'s packages, train/ reading only the
contract (launcher.config), launcher never importing train/; no function over
80 lines and no module over 550.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_layers.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _graph_module():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_check_catches_a_circle_an_upward_import_and_train_reaching_up() -> None:
    g = _graph_module()
    graph = {
        "launcher.config.spec": {"launcher.plan.planner"},  # the contract importing the planner
        "launcher.plan.planner": {"launcher.config.spec"},
        "train.jobs.entry": {"launcher.perf.steptime"},  # train above the contract
        "launcher.run.local": {"train.observe.lifeline"},  # launcher importing train
        "train.models.hf": {"train.loop.state"},  # a model reaching up into the loop
    }
    found = "\n".join(g.violations(graph))
    assert "import circle: launcher.config.spec -> launcher.plan.planner" in found
    assert "upward import: launcher.config.spec -> launcher.plan.planner" in found
    assert "train imports above the contract: train.jobs.entry -> launcher.perf.steptime" in found
    assert "launcher imports train: launcher.run.local -> train.observe.lifeline" in found
    assert "upward import: train.models.hf -> train.loop.state" in found


def test_the_check_catches_a_long_function_and_a_long_module() -> None:
    g = _graph_module()
    # The real tree at tighter limits: the largest function and module are named.
    found = "\n".join(g.oversized(max_function=20, max_module=200))
    assert "function over 20 lines: launcher.perf.steptime:predict (" in found
    assert "module over 200 lines: launcher.perf.steptime (" in found


def test_every_package_says_what_it_owns() -> None:
    for init in sorted([*(ROOT / "launcher").glob("*/__init__.py"), *(ROOT / "train").glob("*/__init__.py")]):
        text = init.read_text().strip()
        assert text.startswith('"""') and len(text.splitlines()[0]) > 10, f"{init}: no docstring"
