"""The run directory's contract (launcher/config/runfiles.py) is the one place
that spells a run-dir file name or a task's exit code: a module that writes
"result.json" or 75 itself fails here, naming the file and line."""

from __future__ import annotations

import ast
from pathlib import Path

from launcher.config import runfiles

ROOT = Path(__file__).resolve().parents[2]
NAMES = {v: k for k, v in vars(runfiles).items() if k.endswith(("_FILE", "_DIR")) and isinstance(v, str)}
CODES = {
    runfiles.REQUEUE_EXIT_CODE: "REQUEUE_EXIT_CODE",
    runfiles.UNCOMMITTED_EXIT_CODE: "UNCOMMITTED_EXIT_CODE",
}
# Words that name a run-dir folder and much else (a cluster kind, a config
# field, a metric label, a JSON key): the contract names them, the scan cannot.
AMBIGUOUS = {"slurm", "logs", "workdir", "checkpoints", "preflight", "progress", "run_id"}
# Files of the same name that are not a run dir's (module, literal): why.
OTHER_FILES = {
    ("launcher/plan/jobs.py", "manifest.json"): "a Hugging Face checkpoint's index",
    ("train/checkpoint/manifest.py", "manifest.json"): "a checkpoint's own manifest",
    ("hydra_plugins/meshrun_slurm/point.py", "config.yaml"): "Hydra's .hydra/config.yaml of a point",
}


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, kinds) and n.body and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }  # fmt: skip


def spelled_outside_the_contract() -> list[str]:
    out = []
    for top in ("launcher", "train", "hydra_plugins"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "launcher/config/runfiles.py":
                continue
            tree = ast.parse(path.read_text(), rel)
            docs = _docstrings(tree)
            for n in ast.walk(tree):
                if not isinstance(n, ast.Constant) or id(n) in docs:
                    continue
                v = n.value
                if isinstance(v, str) and v in NAMES and v not in AMBIGUOUS and (rel, v) not in OTHER_FILES:
                    out.append(f"{rel}:{n.lineno}: {v!r} (runfiles.{NAMES[v]})")
                elif type(v) is int and v in CODES:
                    out.append(f"{rel}:{n.lineno}: {v} (runfiles.{CODES[v]})")
            for f in (n for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)):
                parts = [
                    c.value for c in f.values if isinstance(c, ast.Constant) and isinstance(c.value, str)
                ]
                out += [
                    f"{rel}:{f.lineno}: {part!r} (runfiles.{NAMES[v]})"
                    for part in parts
                    for v in NAMES
                    if v not in AMBIGUOUS and (f"/{v}" in part or part.startswith(f"{v}/"))
                ]
    return out


def test_no_module_spells_a_run_dir_file_or_an_exit_code() -> None:
    found = spelled_outside_the_contract()
    assert not found, "import these from launcher/config/runfiles.py:\n" + "\n".join(found)


def test_the_contract_names_each_file_once() -> None:
    values = [v for k, v in vars(runfiles).items() if k.endswith(("_FILE", "_DIR")) and isinstance(v, str)]
    assert len(values) == len(set(values)), values
    paths = runfiles.RunFiles("/r")
    assert paths.result == Path("/r") / runfiles.RESULT_FILE and paths.log(3) == Path("/r/logs/rank3.log")
