"""Code snapshots, run records, diff and pipeline checks without a cluster
(launcher/run/codesnap.py, launcher/views/rundiff.py, launcher/commands/pipeline.py);
the cluster scenario is tests/cluster/test_reproducible_cluster.py.
Tests that start no process: tests/unit/test_codesnap_units.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.validate import ConfigError
from launcher.run import codesnap

ROOT = Path(__file__).resolve().parents[2]
GIT = ["-c", "user.name=t", "-c", "user.email=t@t"]


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *GIT, *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "launcher").mkdir(parents=True)
    (root / "launcher" / "a.py").write_text("A = 1\n")
    (root / "launcher" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "launcher" / "run.sh", 0o755)
    (root / "conf").mkdir()
    (root / "conf" / "c.yaml").write_text("x: 1\n")
    (root / ".gitignore").write_text("*.log\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "one")
    codesnap._TREES.clear()
    return root


def snap_of(root: Path) -> codesnap.Tree:
    codesnap._TREES.clear()
    tree = codesnap.list_tree(str(root))
    codesnap.hash_tree(tree, codesnap.HashCache(None))
    return tree


def test_git_tree_lists_untracked_leaves_ignored_and_records_the_diff(repo: Path) -> None:
    clean = snap_of(repo)
    assert [f for f, _ in clean.files] == ["conf/c.yaml", "launcher/a.py", "launcher/run.sh"]
    assert clean.git["dirty"] is False and len(clean.git["commit"]) == 40
    (repo / "launcher" / "a.py").write_text("A = 2\n")
    (repo / "launcher" / "new.py").write_text("N = 1\n")
    (repo / "launcher" / "debug.log").write_text("ignored\n")
    (repo / "launcher" / "__pycache__").mkdir()
    dirty = snap_of(repo)
    assert [f for f, _ in dirty.files] == [
        "conf/c.yaml",
        "launcher/a.py",
        "launcher/new.py",
        "launcher/run.sh",
    ]
    assert dirty.git["dirty"] is True and dirty.git["untracked"] == ["launcher/new.py"]
    assert "-A = 1\n+A = 2" in dirty.git["diff"]
    assert dirty.digest != clean.digest


def test_store_is_read_only_content_addressed_and_a_snapshot_of_it_has_its_digest(
    repo: Path, tmp_path: Path
) -> None:
    tree = snap_of(repo)
    store = tmp_path / "runs" / codesnap.STORE_DIR
    path, copied = codesnap.store_tree(tree, store, "meshrun")
    assert copied and path == str(store / codesnap.codestore.user_name() / tree.digest / "meshrun")
    assert os.stat(Path(path) / "launcher" / "a.py").st_mode & 0o777 == 0o444
    assert os.access(Path(path) / "launcher" / "run.sh", os.X_OK)
    assert not [p for p in store.iterdir() if p.name.startswith(".tmp-")]
    again, copied = codesnap.store_tree(snap_of(repo), store, "meshrun")
    assert again == path and not copied  # the same content: the same entry
    inner = snap_of(Path(path))  # outside git: walked; the recorded git state comes along
    assert inner.digest == tree.digest and inner.git["commit"] == tree.git["commit"]


def test_an_empty_workdir_is_a_snapshot_too(tmp_path: Path) -> None:
    """job=script job.module=<an installed package's module> from an empty
    directory: the project tree has no file (this raised FileNotFoundError)."""
    empty = tmp_path / "work"
    empty.mkdir()
    tree = snap_of(empty)
    assert tree.files == []
    store = tmp_path / "runs" / codesnap.STORE_DIR
    path, copied = codesnap.store_tree(tree, store, "project")
    assert copied and Path(path).is_dir() and not any(Path(path).iterdir())
    assert (Path(path).parent / codesnap.SNAPSHOT_FILE).is_file()


def test_hash_cache_does_not_read_an_unchanged_file_again(repo: Path, tmp_path: Path) -> None:
    cache = codesnap.HashCache(tmp_path / "cache.json")
    tree = codesnap.list_tree(str(repo))
    codesnap.hash_tree(tree, cache)
    cache.save()
    warm = codesnap.HashCache(tmp_path / "cache.json")
    codesnap.hash_tree(codesnap.list_tree(str(repo)), warm)
    assert not warm.changed
    (repo / "launcher" / "a.py").write_text("A = 3\n")
    codesnap.hash_tree(snap_of(repo), warm)
    assert warm.changed


def test_over_the_limit_and_dirty_under_clean_are_refused_naming_the_field(repo: Path) -> None:
    tree = snap_of(repo)
    cfg = compose(["launcher.code_max_mb=0.00001"])
    with pytest.raises(
        ConfigError, match=r"launcher.code_max_mb=1e-05 is invalid: .*meshrun snapshot --list"
    ):
        codesnap.check_tree(cfg, tree)
    (repo / "launcher" / "a.py").write_text("A = 2\n")
    with pytest.raises(
        ConfigError, match=r"launcher.code='clean' is invalid: .*uncommitted changes \(launcher/a.py"
    ):
        codesnap.check_tree(compose(["launcher.code=clean"]), snap_of(repo))
    codesnap.check_tree(compose(["launcher.code=snapshot"]), snap_of(repo))  # recorded, not refused


def test_dry_run_says_the_code_and_puts_the_snapshot_on_the_path(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["cluster=testcluster", "launcher.dry_run=true"]
    p = subprocess.run(
        [sys.executable, "-m", "launcher", *args], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("meshrun: code: snapshot "))
    store = str(tmp_path / "runs" / codesnap.STORE_DIR)
    assert (
        store in line and f"export PYTHONPATH={store}/" in p.stdout and "export PYTHONSAFEPATH=1" in p.stdout
    )
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
    live = subprocess.run(
        [sys.executable, "-m", "launcher", *args, "launcher.code=live"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert "meshrun: code: live: the job runs " in live.stdout and f"export PYTHONPATH={ROOT}$" in live.stdout


def test_diff_refuses_a_dir_that_is_not_a_run(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "diff", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert (
        p.returncode == 2
        and f"meshrun: error: '{tmp_path}' is not a run: no readable run_record.json" in p.stderr
    )


def test_diff_groups_config_code_and_data(tmp_path: Path, repo: Path) -> None:
    from launcher.views.rundiff import diff_runs, report

    tree = snap_of(repo)
    store = tmp_path / "store" / codesnap.STORE_DIR
    dir_a, _ = codesnap.store_tree(tree, store, "meshrun")
    (repo / "launcher" / "a.py").write_text("A = 2\n")
    dir_b, _ = codesnap.store_tree(snap_of(repo), store, "meshrun")
    base = {"config": {"train": {"lr": 0.1}, "launcher": {"run_dir": "x"}}, "data": {"files": []}}
    for name, lr, code_dir, size in (("a", 0.1, dir_a, 1), ("b", 0.2, dir_b, 2)):
        run = tmp_path / name
        run.mkdir()
        rec = json.loads(json.dumps(base))
        rec["config"]["train"]["lr"], rec["config"]["launcher"]["run_dir"] = lr, str(run)
        rec["code"] = {"dir": code_dir, "digest": Path(code_dir).parent.name}
        rec["data"]["files"] = [{"path": "/d/tokens.bin", "size": size, "digest": f"x{size}"}]
        (run / "run_record.json").write_text(json.dumps(rec))
    d = diff_runs(str(tmp_path / "a"), str(tmp_path / "b"))
    assert d.causes["config"] == ["train.lr: 0.1 -> 0.2"]
    assert d.causes["code"] == ["launcher/a.py (changed)"]
    assert d.causes["data"] == ["/d/tokens.bin: 1 B x1 -> 2 B x2"]
    text = report(d)
    assert (
        "-A = 1" in text
        and "+A = 2" in text
        and text[-1] == "meshrun diff: 3 difference(s): config 1, code 1, data 1"
    )


def test_pipeline_cli_refuses_a_cycle_writing_nothing(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "overrides: [cluster=testcluster]\nstages:\n  a: {depends_on: [b]}\n  b: {depends_on: [a]}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "pipeline", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert p.returncode == 2 and "meshrun: error: pipeline has a cycle: a -> b -> a" in p.stderr, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["p.yaml"]


def test_pipeline_stage_may_name_a_checkpoint_its_dependency_writes_later(tmp_path: Path) -> None:
    """An eval of an earlier stage's checkpoints is checked before that stage
    ran: the path is not refused for not existing yet; elsewhere it still is."""
    from launcher.commands.pipeline import check_all, load_stages, order

    path = tmp_path / "p.yaml"
    path.write_text(
        "overrides: [cluster=testcluster, model=tiny, launcher.exclusive=false, cluster.gpus_per_node=2]\n"
        "stages:\n  pretrain: {}\n"
        "  eval: {overrides: [job=eval, 'job.checkpoint={run:pretrain}/checkpoints', job.eval_batches=1],"
        " depends_on: [pretrain]}\n"
    )
    common, stages = load_stages(str(path))
    specs = check_all(common, stages, order(stages), tmp_path / "pipe")
    assert specs["eval"][0].cfg.job.checkpoint == str(tmp_path / "pipe" / "pretrain" / "checkpoints")
    stages["eval"]["overrides"][1] = f"job.checkpoint={tmp_path / 'elsewhere'}"
    with pytest.raises(
        ConfigError, match=r"pipeline stage 'eval': job.checkpoint=.*elsewhere.* not a directory"
    ):
        check_all(common, stages, order(stages), tmp_path / "pipe")
    assert not (tmp_path / "pipe").exists()
