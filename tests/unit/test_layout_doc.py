"""docs/layout.md (every module with its docstring's first sentence) and
docs/module-graph.dot are generated from the code: they cannot drift."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gen_layout  # noqa: E402  (scripts/ is not a package)


def test_layout_page_and_module_graph_match_the_code(capsys) -> None:  # type: ignore[no-untyped-def]
    code = gen_layout.main(["--check"])
    assert code == 0, capsys.readouterr().out


def test_every_module_has_a_docstring() -> None:
    missing = [line for line in gen_layout.layout_text().splitlines() if line.endswith("(no docstring)")]
    assert not missing, "modules without a docstring:\n" + "\n".join(missing)
