"""The user documentation stays true to the code: the configuration reference
is the schema's (every field, regenerated, nothing stale), the MkDocs site
builds with --strict (a broken link, anchor or page left out of the nav is an
error), and the README stays a short guide whose links resolve, with no
words of the project's own process in any user page.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_docs.py."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_is_a_short_guide_whose_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 12, links
    for link in links:
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"
    # The two commands, then the five next things.
    assert "bash scripts/setup.sh && . .venv/bin/activate && python -m launcher" in text
    assert "bash scripts/test.sh" in text
    heads = re.findall(r"^### \d\. (.*)$", text, re.M)
    assert len(heads) == 5, heads
