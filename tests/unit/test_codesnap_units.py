"""Code snapshots, run records, diff and pipeline checks without a cluster
(launcher/run/codesnap.py, launcher/views/rundiff.py, launcher/commands/pipeline.py);
the cluster scenario is tests/cluster/test_reproducible_cluster.py.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_codesnap.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from launcher.config.validate import ConfigError
from launcher.run import codesnap

ROOT = Path(__file__).resolve().parents[2]


def test_pipeline_order_refuses_cycles_unknown_stages_and_undeclared_run_refs(tmp_path: Path) -> None:
    from launcher.commands.pipeline import load_stages, order

    def stages(body: str) -> dict:
        path = tmp_path / "p.yaml"
        path.write_text(body)
        return load_stages(str(path))[1]

    ok = stages(
        "stages:\n  export: {depends_on: [eval]}\n  pretrain: {}\n  eval: {overrides: ['job.checkpoint={run:pretrain}'], depends_on: [pretrain]}\n"
    )
    assert order(ok) == ["pretrain", "eval", "export"]
    with pytest.raises(ConfigError, match=r"pipeline has a cycle: a -> b -> a"):
        order(stages("stages:\n  a: {depends_on: [b]}\n  b: {depends_on: [a]}\n"))
    with pytest.raises(ConfigError, match=r"stage 'a' depends on 'nope', which is not a stage \(stages: a\)"):
        order(stages("stages:\n  a: {depends_on: [nope]}\n"))
    with pytest.raises(ConfigError, match=r"uses \{run:a\} but does not depend on 'a'"):
        order(stages("stages:\n  a: {}\n  b: {overrides: ['job.checkpoint={run:a}']}\n"))
    with pytest.raises(ConfigError, match=r"needs a 'stages:' mapping"):
        stages("overrides: []\n")


def test_attempt_digest_is_the_imported_snapshots_not_the_records(tmp_path: Path) -> None:
    from launcher.config.runrecord import imported_digest

    entry = tmp_path / codesnap.STORE_DIR / "d1gest"
    (entry / "meshrun").mkdir(parents=True)
    (entry / codesnap.SNAPSHOT_FILE).write_text(json.dumps({"digest": "d1gest"}))
    assert imported_digest(str(entry / "meshrun")) == "d1gest"
    assert imported_digest(str(ROOT)) is None  # a live checkout: no snapshot beside it


def test_after_a_job_id_names_its_run_dir_from_the_job_comment(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from launcher.slurm import depend
    from launcher.views.runstate import _run_of

    queue = "14|PENDING|meshrun run_dir=/runs/f\n15|RUNNING|meshrun sweep=/runs/s\n"
    monkeypatch.setattr(depend, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, queue, ""))
    cfg = SimpleNamespace(launcher=SimpleNamespace(after="14,15"))
    got = depend.resolve_after(cfg)  # type: ignore[arg-type]
    assert got == [
        {"after": "14", "job_id": "14", "run_dir": "/runs/f", "state": "PENDING"},
        {"after": "15", "job_id": "15", "state": "RUNNING"},  # not a run's job: no run dir
    ]
    assert [_run_of(a) for a in got] == [" (/runs/f)", ""]  # not "job 15 (15)"
