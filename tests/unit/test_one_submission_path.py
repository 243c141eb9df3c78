"""Issue 51's "one submission path": launcher/run/submission.py's submit_runs
is the only caller of sbatch's wrappers (launcher/slurm/submit.py's
submit_run, submit_array and _submit) in launcher/ and hydra_plugins/; the
CLI, the API, pipelines and both Hydra plugins reach Slurm through it. A
module that calls them itself fails here, naming the file and line."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WRAPPERS = {"submit_run", "submit_array", "_submit"}
ALLOWED = {"launcher/run/submission.py", "launcher/slurm/submit.py"}


def direct_submissions(root: Path = ROOT) -> list[str]:
    out = []
    for top in ("launcher", "hydra_plugins"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in ALLOWED:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "launcher.slurm.submit":
                    out += [f"{rel}:{node.lineno} imports {a.name}" for a in node.names if a.name in WRAPPERS]
    return out


def test_only_the_submission_module_runs_sbatch() -> None:
    assert direct_submissions() == []


def test_the_check_sees_a_direct_call(tmp_path: Path) -> None:
    (tmp_path / "launcher" / "commands").mkdir(parents=True)
    (tmp_path / "launcher" / "commands" / "mine.py").write_text(
        "from launcher.slurm.submit import array_key, submit_run\n"
    )
    assert direct_submissions(tmp_path) == ["launcher/commands/mine.py:1 imports submit_run"]
