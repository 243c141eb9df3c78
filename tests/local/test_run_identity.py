"""Run identity (launcher/config/runid.py): every run has its own id, kept in its run
directory, and every location it shares with other runs is named by it.
A reused run dir resumes its own run only, and a changed training config is
refused unless launcher.resume=force.
Tests that start no process: tests/unit/test_run_identity_units.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.runid import RUN_ID_FILE, read_run_id

REPO = Path(__file__).resolve().parents[2]
ID_RE = re.compile(r"^tiny-local-\d{8}T\d{6}Z-[0-9a-f]{4}$")


def launcher(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-m", "launcher", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(p: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err


def started(out: str) -> tuple[str, Path]:
    """(run id, run dir) from the launcher's start line."""
    m = re.search(r"; run (\S+) in (\S+)", out)
    assert m, out
    return m.group(1), Path(m.group(2))


def events(run_dir: Path, kind: str) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if r.get("event") == kind]


def test_dry_run_stores_no_id(tmp_path: Path) -> None:
    p = launcher(f"launcher.run_dir={tmp_path / 'd'}", "launcher.dry_run=true", cwd=tmp_path)
    code, out, err = finish(p)
    assert code == 0, err
    assert not (tmp_path / "d" / RUN_ID_FILE).exists()


@pytest.mark.slow
def test_two_runs_started_together_stay_apart_and_resume_only_themselves(tmp_path: Path) -> None:
    """Two runs of the same config started at once in default (Hydra) run dirs,
    with one node-local root and one shared tier: disjoint checkpoint sets;
    each resumes its own; a config change on resume is refused, or forced."""
    nvme, lustre = tmp_path / "nvme", tmp_path / "lustre"
    common = [
        "train.steps=4",
        "storage.save_every_steps=2",
        "storage.keep_local=1",
        "storage.keep_remote=1",
        f"storage.local_dir={nvme}",
        f"storage.shared_dir={lustre}",
    ]
    procs = [launcher(*common, cwd=tmp_path), launcher(*common, cwd=tmp_path)]
    results = [finish(p) for p in procs]
    for code, out, err in results:
        assert code == 0, out[-2000:] + err[-3000:]
    (id_a, dir_a), (id_b, dir_b) = (started(out) for _, out, _ in results)
    assert id_a != id_b and dir_a != dir_b
    assert ID_RE.match(id_a) and ID_RE.match(id_b)
    assert read_run_id(dir_a) == id_a and read_run_id(dir_b) == id_b
    assert sorted(os.listdir(nvme)) == sorted([id_a, id_b]) == sorted(os.listdir(lustre))
    for run_id in (id_a, id_b):
        # Retention (keep 1) pruned each run's own step 2 and nothing else.
        assert sorted(os.listdir(nvme / run_id)) == ["step_4"]
        assert sorted(os.listdir(lustre / run_id)) == ["step_4"]
    b_before = {p: p.stat().st_mtime_ns for p in (nvme / id_b).rglob("*")}

    # A resumes its own step 4 (B's copies untouched).
    code, out, err = finish(launcher(f"launcher.run_dir={dir_a}", *common[1:], "train.steps=6", cwd=tmp_path))
    assert code == 0, out[-2000:] + err[-3000:]
    assert started(out)[0] == id_a and events(dir_a, "resume") == [4]
    assert {p: p.stat().st_mtime_ns for p in (nvme / id_b).rglob("*")} == b_before
    assert sorted(os.listdir(nvme)) == sorted([id_a, id_b])

    # A changed training config is refused, naming the change, and changes nothing.
    files = {n: (dir_a / n).read_bytes() for n in ("config.yaml", "spec.json", RUN_ID_FILE)}
    code, out, err = finish(
        launcher(f"launcher.run_dir={dir_a}", *common[1:], "train.steps=8", "train.lr=0.01", cwd=tmp_path)
    )
    assert code == 2, out + err
    assert "train.lr: 0.003 -> 0.01" in err and "launcher.resume=force" in err and "Traceback" not in err
    assert {n: (dir_a / n).read_bytes() for n in files} == files

    # ...unless forced: it resumes the same run from its step 6.
    code, out, err = finish(
        launcher(
            f"launcher.run_dir={dir_a}",
            *common[1:],
            "train.steps=8",
            "train.lr=0.01",
            "launcher.resume=force",
            cwd=tmp_path,
        )
    )
    assert code == 0, out[-2000:] + err[-3000:]
    assert started(out)[0] == id_a and events(dir_a, "resume") == [4, 6]
    assert sorted(os.listdir(nvme / id_a)) == ["step_8"]


@pytest.mark.slow
def test_two_sweeps_of_the_same_shape_stay_apart(tmp_path: Path) -> None:
    """Two local sweeps started together (default sweep dirs, points 0 and 1
    each): four runs, four ids, four disjoint checkpoint roots."""
    nvme = tmp_path / "nvme"
    args = [
        "-m",
        "train.seed=1,2",
        "train.steps=2",
        "storage.save_every_steps=2",
        f"storage.local_dir={nvme}",
    ]
    results = [finish(p) for p in [launcher(*args, cwd=tmp_path), launcher(*args, cwd=tmp_path)]]
    for code, out, err in results:
        assert code == 0, out[-2000:] + err[-3000:]
    manifests = sorted((tmp_path / "runs" / "sweeps").glob("*/manifest.json"))
    assert len(manifests) == 2, manifests
    points = [p for m in manifests for p in json.loads(m.read_text())["points"]]
    assert len(points) == 4 and all(p["status"] == "ran here" for p in points)
    ids = [p["run_id"] for p in points]
    assert len(set(ids)) == 4 and all(ID_RE.match(i) for i in ids)
    assert [Path(p["run_dir"]).name for p in points] == ["0", "1", "0", "1"]  # same shape
    assert all(read_run_id(p["run_dir"]) == p["run_id"] for p in points)
    assert sorted(os.listdir(nvme)) == sorted(ids)
    assert all(os.listdir(nvme / i) == ["step_2"] for i in ids)
    # Point 0 of the first sweep, resumed, sees its own step 2 only.
    p0 = points[0]
    code, out, err = finish(
        launcher(
            f"launcher.run_dir={p0['run_dir']}",
            "train.seed=1",
            "train.steps=3",
            f"storage.local_dir={nvme}",
            cwd=tmp_path,
        )
    )
    assert code == 0, out[-2000:] + err[-3000:]
    assert started(out)[0] == p0["run_id"] and events(Path(p0["run_dir"]), "resume") == [2]
