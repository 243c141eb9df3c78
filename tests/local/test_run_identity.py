"""Run identity (launcher/config/runid.py): every run has its own id, kept in its run
directory, and every location it shares with other runs is named by it.
A reused run dir resumes its own run only, and a changed training config is
refused unless launcher.resume=force."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.runid import RUN_ID_FILE, claim_run_id, new_run_id, read_run_id
from launcher.config.spec import RunSpec, load_spec, save_spec
from launcher.plan.make import make_plan
from launcher.run.rundir import config_changes

REPO = Path(__file__).resolve().parents[2]
ID_RE = re.compile(r"^tiny-local-\d{8}T\d{6}Z-[0-9a-f]{4}$")


def test_ids_of_the_same_second_differ_and_are_readable() -> None:
    ids = {new_run_id("13b-4node", now=1_800_000_000.0) for _ in range(50)}
    assert len(ids) > 45  # 4 hex digits: a same-second collision is a 1-in-65536 event per pair
    one = next(iter(ids))
    assert re.fullmatch(r"13b-4node-20270115T080000Z-[0-9a-f]{4}", one), one
    # Names are reduced to characters safe in paths, S3 keys and job names.
    assert new_run_id("my run/../x", now=0).startswith("my-run-..-x-19700101T000000Z-")


def test_claim_keeps_the_run_dirs_id(tmp_path: Path) -> None:
    first = claim_run_id(tmp_path / "run", "tiny-local")
    assert ID_RE.match(first) and read_run_id(tmp_path / "run") == first
    assert claim_run_id(tmp_path / "run", "other") == first
    assert sorted(os.listdir(tmp_path / "run")) == [RUN_ID_FILE]  # no temp file left


def test_save_spec_gives_the_id_and_load_keeps_it(tmp_path: Path) -> None:
    cfg = compose([])
    spec = RunSpec(cfg, make_plan(cfg), str(tmp_path / "r"))
    save_spec(spec)
    assert ID_RE.match(spec.run_id) and read_run_id(tmp_path / "r") == spec.run_id
    assert load_spec(tmp_path / "r").run_id == spec.run_id
    again = RunSpec(cfg, make_plan(cfg), str(tmp_path / "r"))
    save_spec(again)  # a restart of the same dir: same run
    assert again.run_id == spec.run_id


def test_tiers_are_named_by_the_run_id(tmp_path: Path) -> None:
    from train.checkpoint.tiers import local_root, run_name

    cfg = compose([f"storage.local_dir={tmp_path / 'nvme'}"])
    a = RunSpec(cfg, make_plan(cfg), str(tmp_path / "x" / "0"))
    b = RunSpec(cfg, make_plan(cfg), str(tmp_path / "y" / "0"))  # same basename, another run
    with pytest.raises(ValueError, match="no run id"):
        run_name(a)
    save_spec(a)
    save_spec(b)
    assert run_name(a) == a.run_id != run_name(b) == b.run_id
    assert local_root(a) == str(tmp_path / "nvme" / a.run_id) == a.checkpoint_dir


def test_config_changes_name_training_fields_only() -> None:
    import dataclasses

    old = dataclasses.asdict(compose(["train.steps=10"]))
    same = dataclasses.asdict(
        compose(
            [
                "train.steps=99",
                "train.log_every_steps=1",
                "train.wandb=offline",
                "data.num_workers=0",
                "storage.keep_local=5",
                "cluster.local_processes=1",
            ]
        )
    )
    assert config_changes(old, same) == []
    changed = dataclasses.asdict(compose(["train.lr=0.01", "model.dim=128"]))
    assert config_changes(old, changed) == ["model.dim: 64 -> 128", "train.lr: 0.003 -> 0.01"]


def test_slurm_job_name_is_the_run_id_and_arrays_group_points() -> None:
    from launcher.slurm.render import sbatch_parameters
    from launcher.slurm.submit import array_key

    cfg = compose(["cluster=testcluster"])
    a = RunSpec(cfg, make_plan(cfg), "/runs/s/0", run_id="tiny-testcluster-20261201T000000Z-aaaa")
    b = RunSpec(cfg, make_plan(cfg), "/runs/s/1", run_id="tiny-testcluster-20261201T000000Z-bbbb")
    assert sbatch_parameters(a)["job_name"] == a.run_id
    assert array_key(a) == array_key(b)  # one array: scripts differ only by run dir and id


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
