"""The Python API (launcher/api.py) over the CLI's code: a tiny model's
plan, a refusal with the CLI's own message and nothing written, and a local
run started, waited for and read back through the handle. The cluster test
(one script job and a 3-point script sweep as one array) is tests/cluster/test_api_slurm.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import api

ROOT = Path(__file__).resolve().parents[2]


def test_import_is_torch_and_hydra_free() -> None:
    code = "import sys, launcher.api; assert not {'torch', 'hydra'} & set(sys.modules), sorted(sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_plan_of_a_tiny_model_is_the_dry_run_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    p = api.plan(["model=tiny", "cluster=testcluster", "cluster.nodes=2", f"launcher.runs_root={tmp_path}"])
    assert p.layout == "hsdp: dp_replicate=2 x dp_shard=8 (16 ranks, cpu/gloo)", p.layout
    assert p.plan.world_size == 16 and p.plan.nodes == 2
    assert 0 < p.memory_gb == p.plan.memory.total_gb
    assert p.step_s is None  # a CPU plan: no GPU peak to predict from
    assert "meshrun plan: model=tiny cluster=testcluster" in p.report and "memory" in p.report
    assert p.sbatch is not None and "#SBATCH --nodes=2" in p.sbatch and p.spec.run_dir in p.sbatch
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing
    gpu = api.plan(["model=7b", "cluster=4node"])
    assert gpu.step_s is not None and gpu.step_s > 0 and gpu.cost is not None and gpu.cost.usd_on_demand > 0
    assert api.plan(["train.steps=2"]).sbatch is None  # cluster=local: no batch script


def test_a_refused_override_raises_the_clis_message_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    bad = ["parallelism.tp=3", f"launcher.runs_root={tmp_path}"]
    with pytest.raises(api.ConfigError) as e:
        api.submit(bad)
    msg = str(e.value)
    assert "parallelism.tp=3 is invalid" in msg and "choose parallelism.tp from 1, 2" in msg, msg
    cli = subprocess.run(
        [sys.executable, "-m", "launcher", *bad], cwd=tmp_path, capture_output=True, text=True
    )
    assert cli.returncode == 2 and cli.stderr.strip() == f"meshrun: error: {msg}", cli.stderr
    with pytest.raises(api.ConfigError, match=r"\(model=bogus\): choose one of .*tiny"):
        api.plan(["model=bogus"])
    assert list(tmp_path.iterdir()) == []


def readme_example() -> str:
    """README's Python example (the ```python block under "From Python")."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"### From Python\n\n```python\n(.*?)```", text, re.S)
    assert m, "README.md lost its Python API example"
    return m.group(1)


def test_readmes_example_runs_locally_through_the_handle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # runs/ here
    code = readme_example()
    assert len([x for x in code.splitlines() if x.strip()]) == 5, code
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)  # as written: plan 13b, run 4 local steps, wait, read
    out = capsys.readouterr().out
    run = ns["run"]
    assert "meshrun plan: model=13b cluster=4node" in out and "done: step 4" in out, out
    assert run.job_id is None and Path(run.run_dir).parent.parent == tmp_path / "runs"
    assert run.status().state == "COMPLETED" and run.status().step == "4"
    result = run.result()
    assert result["status"] == "completed" and result["final_step"] == 4, result
    assert run.logs(rank=9) == ""  # no rank 9
    assert "meshrun: completed at step 4" in Path(run.launcher_log or "").read_text()
    assert run.cancel() is False  # it has ended: nothing to cancel (said, as by meshrun cancel)
    with pytest.raises(api.RunError, match="has no result: it is NOT STARTED"):
        api.Run(str(tmp_path / "never")).result()
