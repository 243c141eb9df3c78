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


def test_every_file_the_docs_and_conf_name_exists() -> None:
    """A path to a module, script or test in the docs, README or conf/'s
    comments names a file that exists (a move updates them; placeholders in
    capitals, like launcher/commands/NAME.py, are not paths)."""
    import re

    pattern = re.compile(
        r"\b(?:launcher|train|hydra_plugins|scripts|tests)/[A-Za-z0-9_/.-]+\.(?:py|sh|yaml)\b"
    )
    texts = [*(ROOT / "docs").glob("*.md"), ROOT / "README.md", *(ROOT / "conf").rglob("*.yaml")]
    missing = sorted(
        f"{t.relative_to(ROOT)}: {p}"
        for t in texts
        for p in set(pattern.findall(t.read_text()))
        if not re.search(r"/[A-Z]+\.", p) and not (ROOT / p).exists()
    )
    assert not missing, "named but not there:\n" + "\n".join(missing)
