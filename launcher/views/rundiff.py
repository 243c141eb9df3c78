"""What differs between two runs, from their run records (launcher/config/runrecord.py).

Grouped: config (field by field), code (a unified diff of the two
snapshots, by file), packages and versions (as each job saw them at its last
start), image, data files, and, for finished runs, the loss curves' first
divergent step. The first five are causes; the loss curve is a result,
reported but not counted (two runs that differ in a cause also differ there).
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.runfiles import METRICS_FILE, RECORD_FILE, RESULT_FILE, SPEC_FILE
from launcher.config.runrecord import read_record
from launcher.config.validate import ConfigError
from launcher.run.codesnap import SNAPSHOT_FILE, HashCache, hash_tree, list_tree
from launcher.run.rundir import flatten

# Fields that name or schedule the run, not what it computes.
NOT_COMPARED = {"launcher.run_dir", "launcher.dry_run", "launcher.verbose", "launcher.after", "launcher.hold"}


@dataclass
class Diff:
    """Differences by group (config, code, packages, image, data), each a list of lines."""

    causes: dict[str, list[str]] = field(default_factory=dict)
    code_text: list[str] = field(default_factory=list)  # the unified diffs
    loss: str = ""

    @property
    def identical(self) -> bool:
        return not any(self.causes.values())


def load(run_dir: str) -> dict[str, Any]:
    """A run's record; :class:`ConfigError` for a dir that is not a run."""
    path = Path(run_dir)
    if not path.is_dir():
        raise ConfigError(f"{run_dir!r} is not a run: no such directory")
    rec = read_record(path)
    if rec is None:
        has_spec = (path / SPEC_FILE).is_file()
        why = "it predates run records" if has_spec else "not a run directory"
        raise ConfigError(f"{run_dir!r} is not a run: no readable {RECORD_FILE} ({why})")
    return rec


def _changes(a: dict[str, Any], b: dict[str, Any], skip: set[str] = frozenset()) -> list[str]:
    missing = object()
    return [
        f"{k}: {a.get(k, '(unset)')!r} -> {b.get(k, '(unset)')!r}"
        for k in sorted(a.keys() | b.keys())
        if k not in skip and a.get(k, missing) != b.get(k, missing)
    ]


def code_files(code: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """(the dir holding a run's code, rel path -> sha256): the store's
    snapshot.json when it was copied, else the code dir hashed now (live or
    local runs: what the dir holds today, which may have changed since)."""
    root = str(code.get("dir") or "")
    meta = Path(root).parent / SNAPSHOT_FILE
    if meta.is_file():
        return root, dict(json.loads(meta.read_text()).get("files", {}))
    if not os.path.isdir(root):
        return root, {}
    tree = list_tree(root)
    hash_tree(tree, HashCache(None))
    return root, tree.hashes


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.readlines()
    except UnicodeDecodeError:
        return ["(binary file)\n"]
    except OSError:
        return []


def diff_code(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(one line per changed file, the unified diffs)."""
    if a.get("digest") and a.get("digest") == b.get("digest"):
        return [], []
    root_a, files_a = code_files(a)
    root_b, files_b = code_files(b)
    if not files_a or not files_b:
        gone = root_a if not files_a else root_b
        return [f"digests {a.get('digest')} and {b.get('digest')} differ; {gone} is gone, no file diff"], []
    names, text = [], []
    for rel in sorted(files_a.keys() | files_b.keys()):
        if files_a.get(rel) == files_b.get(rel):
            continue
        state = "added" if rel not in files_a else "removed" if rel not in files_b else "changed"
        names.append(f"{rel} ({state})")
        old = _read_lines(os.path.join(root_a, rel)) if rel in files_a else []
        new = _read_lines(os.path.join(root_b, rel)) if rel in files_b else []
        text += difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}")
    if not names and a.get("digest") != b.get("digest"):  # live dirs, hashed now: one version left
        return [
            f"digests {a.get('digest')} and {b.get('digest')} differ; {root_b} is live (not copied): no file diff"
        ], []
    return names, text


def _last_attempt(rec: dict[str, Any]) -> dict[str, Any]:
    attempts = rec.get("attempts") or []
    return attempts[-1] if attempts else {}


def diff_packages(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    ta, tb = _last_attempt(a), _last_attempt(b)
    if not ta or not tb:
        return []  # a run that never started: nothing seen by a job to compare
    pa = {"python": ta.get("python"), **(ta.get("packages") or {})}
    pb = {"python": tb.get("python"), **(tb.get("packages") or {})}
    return _changes(pa, pb)


def diff_data(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    fa = {f["path"]: f for f in (a.get("data") or {}).get("files", [])}
    fb = {f["path"]: f for f in (b.get("data") or {}).get("files", [])}
    out = []
    for path in sorted(fa.keys() | fb.keys()):
        x, y = fa.get(path), fb.get(path)
        if x is None or y is None:
            out.append(f"{path}: {'only in B' if x is None else 'only in A'}")
        elif (x["size"], x["digest"]) != (y["size"], y["digest"]):
            out.append(f"{path}: {x['size']} B {x['digest']} -> {y['size']} B {y['digest']}")
    return out


def losses(run_dir: str) -> list[tuple[int, float]]:
    path = Path(run_dir) / METRICS_FILE
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "loss" in rec and "step" in rec and "event" not in rec and rec["loss"] is not None:
            out.append((int(rec["step"]), float(rec["loss"])))
    return out


def _finished(run_dir: str) -> bool:
    try:
        return json.loads((Path(run_dir) / RESULT_FILE).read_text()).get("status") == "completed"
    except (OSError, ValueError):
        return False


def diff_loss(dir_a: str, dir_b: str) -> str:
    """The loss curves' first divergent step (finished runs only)."""
    if not (_finished(dir_a) and _finished(dir_b)):
        return "not compared (a run has not completed)"
    la, lb = dict(losses(dir_a)), dict(losses(dir_b))
    for step in sorted(la.keys() & lb.keys()):
        if la[step] != lb[step]:
            return f"first divergent step {step}: {la[step]!r} vs {lb[step]!r}"
    if la.keys() != lb.keys():
        return f"equal on the {len(la.keys() & lb.keys())} common steps; logged steps differ"
    return f"bitwise equal over {len(la)} logged steps"


def diff_runs(dir_a: str, dir_b: str) -> Diff:
    a, b = load(dir_a), load(dir_b)
    d = Diff()
    d.causes["config"] = _changes(flatten(a.get("config", {})), flatten(b.get("config", {})), NOT_COMPARED)
    d.causes["code"], d.code_text = diff_code(a.get("code") or {}, b.get("code") or {})
    # A script job's own project (job.workdir), compared like meshrun's code.
    pa, pb = (a.get("code") or {}).get("project") or {}, (b.get("code") or {}).get("project") or {}
    if pa or pb:
        names, text = (
            diff_code(pa, pb) if pa and pb else (["one run has no project (job=script) to compare"], [])
        )
        d.causes["code"] += [f"project {n}" for n in names]
        d.code_text += text
    d.causes["packages"] = diff_packages(a, b)
    d.causes["image"] = _changes({"image": a.get("image")}, {"image": b.get("image")})
    d.causes["data"] = diff_data(a, b)
    d.loss = diff_loss(dir_a, dir_b)
    return d


def report(d: Diff, *, show_code: bool = True) -> list[str]:
    lines = []
    for group, items in d.causes.items():
        lines += [f"{group}: {item}" for item in items]
    if show_code and d.code_text:
        lines += [t.rstrip("\n") for t in d.code_text]
    lines.append(f"loss curves: {d.loss}")
    counted = {g: len(v) for g, v in d.causes.items() if v}
    if counted:
        groups = ", ".join(f"{g} {n}" for g, n in counted.items())
        lines.append(f"meshrun diff: {sum(counted.values())} difference(s): {groups}")
    else:
        lines.append("meshrun diff: identical (config, code, packages, image, data)")
    return lines
