"""The user documentation stays true to the code: the configuration reference
is the schema's (every field, regenerated, nothing stale), the MkDocs site
builds with --strict (a broken link, anchor or page left out of the nav is an
error), and the README stays a short guide whose links resolve, with no
words of the project's own process in any user page.
Tests that start no process: tests/unit/test_docs_units.py."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

from launcher.config import schema

ROOT = Path(__file__).resolve().parents[2]
# Pages written for users (the architecture pages are for contributors).
USER_PAGES = [
    "index.md",
    "your-cluster.md",
    "your-code.md",
    "python-api.md",
    "hydra-launcher.md",
    "configuration.md",
    "slurm.md",
    "checkpoints.md",
    "self-healing.md",
    "fleet.md",
    "security.md",
    "troubleshooting.md",
    "speed.md",
    "reproducibility.md",
    "layout.md",
]
PROCESS_WORDS = re.compile(r"\b(seed article|the seed's|issue \d+|CI budget|stop(ped)? rule)\b", re.I)


def test_configuration_reference_is_regenerated_and_lists_every_field() -> None:
    p = subprocess.run(
        [sys.executable, "scripts/gen_config_ref.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {}
    for line in (ROOT / "docs" / "configuration.md").read_text().splitlines():
        m = re.match(
            r"\| `([a-z_]+\.[a-z0-9_]+)` \| ([^|]+) \| ((?:[^|\\]|\\.)+) \| ([^|]*) \| (.*) \|$", line
        )
        if m:
            rows[m.group(1)] = m.groups()[1:]
    for section in dataclasses.fields(schema.RunConfig):
        for f in dataclasses.fields(section.default_factory()):
            key = f"{section.name}.{f.name}"
            assert key in rows, f"{key} is missing from docs/configuration.md"
            _type, _default, choices, meaning = rows[key]
            assert meaning.strip(), f"{key} has no comment in launcher/config/schema.py"
            for c in f.metadata.get("choices", ()):
                assert f"`{c}`" in choices, (key, c)
    assert rows["train.steps"][1].strip() == "`40`" and rows["cluster.kind"][2] == "`local`, `slurm`"


def test_the_site_builds_strict(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    for page in ("index", "configuration", "troubleshooting", "your-cluster"):
        html = tmp_path / "site" / ("index.html" if page == "index" else f"{page}/index.html")
        assert html.is_file(), html
    assert "cluster.gpus_per_node" in (tmp_path / "site" / "configuration" / "index.html").read_text()


def test_no_process_words_in_user_docs() -> None:
    for name in ["../README.md", *USER_PAGES]:
        text = (ROOT / "docs" / name).read_text()
        found = PROCESS_WORDS.search(text)
        assert not found, f"docs/{name} says {found.group(0)!r}"
