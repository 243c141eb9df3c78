"""Rendering the sbatch script: golden files, flags, errors. No Slurm needed.
Tests that start no process: tests/unit/test_slurm_render_units.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config import ncclenv as nccl
from launcher.config.compose import compose
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan
from launcher.slurm.render import render_sbatch, sbatch_parameters

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import regen_golden  # noqa: E402


def spec_for(*overrides: str, run_dir: str = "/r/run") -> RunSpec:
    cfg = compose(list(overrides))
    nccl.apply(cfg.cluster)  # as `python -m launcher` does before rendering
    return RunSpec(cfg, make_plan(cfg), run_dir)


@pytest.mark.parametrize("cluster", regen_golden.slurm_presets())
def test_golden(cluster: str) -> None:
    golden = ROOT / "tests" / "golden" / f"sbatch_{cluster}.sh"
    assert golden.exists(), f"missing {golden.name}: run python scripts/regen_golden.py"
    assert regen_golden.render_golden(cluster) == golden.read_text(), (
        f"{golden.name} is stale: run python scripts/regen_golden.py and review the diff"
    )


def test_parameters_follow_plan_and_presets() -> None:
    spec = spec_for("cluster=4node", "model=13b", "qos=training", "launcher.signal_lead_s=90")
    p = sbatch_parameters(spec)
    assert p["nodes"] == 4 and p["ntasks_per_node"] == 8 and p["gpus_per_node"] == 8
    assert p["cpus_per_task"] == 192 // 8
    assert (p["partition"], p["qos"], p["account"], p["time"]) == ("training", "training", "training", 4320)
    assert p["exclusive"] is True
    text = render_sbatch(spec, "/r/run/slurm", python="py", code_dir="/c")
    assert "#SBATCH --signal=USR2@90" in text
    assert "#SBATCH --requeue" in text
    assert "py -u -m train /r/run" in text
    assert "export NCCL_IB_HCA==mlx5_0," in text  # the NCCL preset of the fabric
    assert '"$MESHRUN_FAILURE_RESTARTS" -gt 3 ]' in text  # launcher.max_restarts: failures only
    # Fail fast: one rank dying ends the step and the job.
    assert "srun --unbuffered" in text and "--kill-on-bad-exit=1" in text.split("srun --unbuffered", 1)[1]
    # The requeue decision asks Slurm (a cancelled job is not requeued).
    assert 'scontrol -o show job "$SLURM_JOB_ID"' in text and "PreemptTime=" in text


def test_signal_lead_is_planned_from_the_final_save() -> None:
    """launcher.signal_lead_s=0 plans the USR2 lead: 120 s when the final
    save is quick, longer when it is not; an explicit lead too short for the
    save is refused naming the field and what to set."""
    small = spec_for("cluster=4node", "model=13b")
    assert small.plan.signal_lead_s == 120
    assert "#SBATCH --signal=USR2@120" in render_sbatch(small, "/r/run/slurm", python="py", code_dir="/c")
    big = spec_for("cluster=4node", "model=70b")  # ~212 GB per node to the run dir's filesystem
    assert big.plan.signal_lead_s > 120
    assert any("qos.grace_time_s=120" in w and "GraceTime >=" in w for w in big.plan.warnings)
    with pytest.raises(
        ConfigError, match=r"launcher.signal_lead_s=60 is invalid: .* set launcher.signal_lead_s >= \d+"
    ):
        spec_for("cluster=4node", "model=70b", "launcher.signal_lead_s=60")


def test_no_exclusive_and_explicit_port() -> None:
    spec = spec_for("cluster=testcluster", "launcher.exclusive=false", "launcher.master_port=29555")
    text = render_sbatch(spec, "/r/run/slurm", python="py", code_dir="/c")
    assert "--exclusive" not in text
    assert "export MASTER_PORT=29555" in text


def test_render_is_deterministic() -> None:
    spec = spec_for("cluster=2node", "model=7b")
    a = render_sbatch(spec, "/f", python="p", code_dir="/c")
    b = render_sbatch(spec_for("cluster=2node", "model=7b"), "/f", python="p", code_dir="/c")
    assert a == b


def test_container_without_pyxis_is_refused() -> None:
    with pytest.raises(ConfigError, match="cluster.container_image"):
        spec_for("cluster=testcluster", "cluster.container_image=img")


def test_script_is_valid_bash(tmp_path: Path) -> None:
    spec = spec_for(
        "cluster=4node", "model=13b", "cluster.container_image='nvcr.io#nvidia/pytorch:25.03-py3'"
    )
    script = tmp_path / "s.sh"
    script.write_text(render_sbatch(spec, tmp_path, python="python3", code_dir="/c"))
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_regen_check_passes() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "regen_golden.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_array_golden_mounts_every_point_run_dir() -> None:
    """A job array with a container: every task's run dir is inside a mount
    (the sweep root), not only the first point's."""
    golden = ROOT / "tests" / "golden" / "sbatch_array_4node.sh"
    assert regen_golden.render_array_golden() == golden.read_text(), (
        f"{golden.name} is stale: run python scripts/regen_golden.py and review the diff"
    )
    text = golden.read_text()
    assert "#SBATCH --array=0-1%2" in text
    srun_lines = [
        line.removeprefix("if ! ") for line in text.splitlines() if line.startswith(("srun ", "if ! srun "))
    ]
    assert len(srun_lines) == 3  # preflight, all-reduce, training
    for line in srun_lines:
        mounts = next(w for w in line.split() if w.startswith("--container-mounts="))
        sources = [m.split(":")[0] for m in mounts.split("=", 1)[1].split(",")]
        for point in ("/shared/runs/golden/sweep/0", "/shared/runs/golden/sweep/1"):
            assert any(point.startswith(s + "/") for s in sources), (point, sources)
    assert '-m train "$MESHRUN_ARRAY_RUN_DIR"' in text


def test_array_mounts_points_outside_the_sweep_root() -> None:
    from launcher.slurm.render import array_mount_dirs

    assert array_mount_dirs(["/s/0", "/s/1"], "/s/slurm") == ["/s"]
    assert array_mount_dirs(["/s/0", "/elsewhere/1"], "/s/slurm") == ["/s/0", "/elsewhere/1"]
    spec = spec_for(
        "cluster=4node", "model=13b", "cluster.container_image='nvcr.io#nvidia/pytorch:25.03-py3'"
    )
    from launcher.slurm.render import srun_args

    mounts = next(a for a in srun_args(spec, "/s/slurm", "/c", ["/s/0", "/elsewhere/1"]) if "mounts" in a)
    assert "/s/0:/s/0" in mounts and "/elsewhere/1:/elsewhere/1" in mounts and "/s/slurm:/s/slurm" in mounts


def test_image_paths_resolve_and_registry_refs_pass_through(tmp_path: Path, monkeypatch) -> None:
    from launcher.config.image_ref import resolve_image
    from launcher.slurm.container import check_image, container_name

    monkeypatch.chdir(tmp_path)
    assert resolve_image("images/x.sqsh") == str(tmp_path / "images" / "x.sqsh")
    assert resolve_image("./x.sqsh") == str(tmp_path / "x.sqsh")
    for ref in ("nvcr.io#nvidia/pytorch:25.01-py3", "docker://ubuntu:24.04", "ubuntu:24.04"):
        assert resolve_image(ref) == ref
        check_image(ref)  # registry refs are not checked here: enroot pulls them
    with pytest.raises(
        ConfigError, match=r"cluster.container_image=.*x.sqsh.*does not exist.*launcher.image"
    ):
        check_image(resolve_image("images/x.sqsh"))
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "x.sqsh").write_bytes(b"img")
    check_image(str(tmp_path / "images" / "x.sqsh"))
    # Composed configs carry the absolute path; the name is stable per image.
    spec = spec_for("cluster=4node", "model=13b", "cluster.container_image=images/x.sqsh")
    assert spec.cfg.cluster.container_image == str(tmp_path / "images" / "x.sqsh")
    a = container_name(spec.cfg.cluster.container_image)
    assert a == container_name(str(tmp_path / "images" / "x.sqsh")) != container_name("ubuntu:24.04")
    assert a.startswith("meshrun_")
