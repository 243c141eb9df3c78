"""Real Pyxis + Enroot containers on the local test cluster.

scripts/testcluster.sh builds Pyxis and Enroot from ../shared and a test
image ($DIR/images/meshrun-test.sqsh): Enroot's skeleton with the host's /usr
and python prefix mounted read-only, plus ``/opt/meshrun-test/python``, a
wrapper that exists only in the image. Runs use it as
``cluster.container_python``, so every step that started in the container
(preflight, all-reduce, training) leaves a proof file in its run dir that
only the image could have written. Few, short jobs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import cluster_base, events, job_id_from, launch, losses, wait_jobs, wait_step
from testcluster_util import CLUSTER_DIR, IMAGE, container_overrides, require_test_cluster

BASE = cluster_base(time_limit_min=3)

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def pyxis_cluster():
    conf = require_test_cluster()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    from launcher.slurm.cluster import pyxis_available

    if not pyxis_available():
        pytest.skip(
            "no Pyxis on the test cluster: scripts/testcluster.sh start installs it from ../shared "
            "(or MESHRUN_SHARED_DIR) when the Pyxis/Enroot sources are there"
        )
    if not os.path.isfile(IMAGE):
        pytest.skip(f"no test image {IMAGE} (scripts/testcluster.sh start builds it)")
    yield
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


def proofs(run_dir: Path) -> dict[str, str]:
    """``job.step.rank`` -> what the in-image wrapper recorded."""
    d = run_dir / "container-proof"
    return {p.name: p.read_text() for p in d.iterdir()} if d.is_dir() else {}


def steps_inside(run_dir: Path, module: str) -> list[str]:
    return [k for k, v in proofs(run_dir).items() if v.startswith("meshrun-test-image ") and module in v]


def test_missing_local_image_is_refused_before_submission(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = launch(
        *BASE,
        "cluster.nodes=1",
        "cluster.gpus_per_node=2",
        *container_overrides("images/missing.sqsh"),  # relative: resolved against the cwd
        f"launcher.run_dir={run_dir}",
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr
    assert f"cluster.container_image='{tmp_path}/images/missing.sqsh'" in out.stderr, out.stderr
    assert "does not exist" in out.stderr and "Traceback" not in out.stderr
    assert not run_dir.exists()  # nothing written, nothing submitted


def test_container_job_trains_preempted_requeued_and_resumes(tmp_path: Path) -> None:
    """Two 2-task jobs in the container: the reference runs preflight (node
    checks + all-reduce) and trains to the end uninterrupted; the victim is
    preempted, checkpoints into its mounted run dir, is requeued, resumes
    and matches the reference's losses. Every step ran inside the image."""
    common = [
        *BASE,
        "cluster.nodes=1",
        "cluster.gpus_per_node=2",
        "train.steps=80",
        "train.log_every_steps=5",
        *container_overrides(),
    ]
    victim_dir, ref_dir = tmp_path / "victim", tmp_path / "ref"
    out = launch(*common, f"launcher.run_dir={victim_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    victim = job_id_from(out.stdout)
    out = launch(
        *common,
        "qos=training",
        "qos.time_limit_min=4",
        "cluster.preflight=true",
        "cluster.mem_per_node_gb=8",  # the nodes' nominal 256 GB would fail the RAM check
        f"launcher.run_dir={ref_dir}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    ref = job_id_from(out.stdout)
    wait_step(victim_dir, 10, 180)
    # A training-QOS job that needs the victim's node: only preempting it
    # frees the memory (whatever else runs on the other nodes).
    from launcher.slurm.cluster import jobs

    node = jobs([victim])[victim].node_list
    subprocess.run(
        ["sbatch", "--parsable", "-N1", "-w", node, "-p", "training", "-q", "training", "-A", "training",
         "-t", "1", "--mem=200G", "-o", "/dev/null", "--wrap", "sleep 2"],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    recs = wait_jobs([victim, ref], 300)
    logs = "".join(p.read_text()[-1500:] for p in (victim_dir / "slurm").glob("*_log.err"))
    assert recs[victim].state == "COMPLETED" and recs[ref].state == "COMPLETED", (recs, logs)
    assert recs[victim].restarts >= 1

    # Inside: training (2 ranks, each run of the victim), preflight and all-reduce.
    assert len(steps_inside(ref_dir, "-m train ")) == 2, proofs(ref_dir)
    assert len(steps_inside(ref_dir, "launcher.preflight")) == 1, proofs(ref_dir)
    assert len(steps_inside(ref_dir, "train.observe.preflight_comm")) == 2, proofs(ref_dir)
    assert (ref_dir / "preflight" / "allreduce.json").exists()
    assert len(steps_inside(victim_dir, "-m train ")) >= 4, proofs(victim_dir)  # 2 ranks x 2 runs
    for d in (victim_dir, ref_dir):
        rec = json.loads((d / "container.json").read_text())
        assert rec["image"] == IMAGE and rec["digest"].startswith("sha256:")
        assert json.loads((d / "result.json").read_text())["final_step"] == 80

    resumes = events(victim_dir, "resume")
    assert resumes and resumes[0]["step"] > 0, "the victim did not resume from a checkpoint"
    assert events(victim_dir, "preempted")
    a, b = losses(victim_dir), losses(ref_dir)
    after = [s for s in a if s > resumes[0]["step"] and s in b]
    assert after and all(abs(a[s] - b[s]) <= 1e-6 * max(1.0, abs(b[s])) for s in after), (a, b)


def test_container_sweep_array_each_point_in_its_own_run_dir(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    out = launch(
        "-m",
        *BASE,
        "cluster.nodes=1",
        "cluster.gpus_per_node=2",
        "train.steps=5",
        "train.lr=0.001,0.002",
        *container_overrides(),
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    points = json.loads((sweep / "manifest.json").read_text())["points"]
    assert [p["status"] for p in points] == ["submitted", "submitted"]
    assert len({p["array"] for p in points}) == 1  # one job array
    t0 = time.monotonic()
    recs = wait_jobs([p["job_id"] for p in points], 240)
    assert all(r.state == "COMPLETED" for r in recs.values()), (recs, time.monotonic() - t0)
    for p in points:
        run_dir = Path(p["run_dir"])
        inside = steps_inside(run_dir, "-m train ")
        assert len(inside) == 2, proofs(run_dir)
        # Each task trained its own point, seen at its own path in the container.
        assert all(proofs(run_dir)[k].rstrip().endswith(str(run_dir)) for k in inside)
        result = json.loads((run_dir / "result.json").read_text())
        assert result["status"] == "completed" and result["final_step"] == 5


BASE_IMAGE = os.path.join(CLUSTER_DIR, "images", "debian-python.sqsh")


def test_image_command_builds_an_image_and_a_job_runs_in_it(tmp_path: Path) -> None:
    """``python -m launcher.image build`` from a local Debian + python3 base,
    offline (--deps copy): the job runs on the image's own /usr/bin/python3
    with meshrun's dependencies from the image, nothing of the host mounted
    but the code and the run dir."""
    from launcher.config import ncclenv as nccl
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.run.rundir import write_run_dir
    from launcher.slurm.render import submitit_parameters, task_command
    from launcher.slurm.submit import _submit

    if not os.path.isfile(BASE_IMAGE):
        pytest.skip(f"no base image {BASE_IMAGE} (scripts/testcluster.sh start builds it)")
    out_image = tmp_path / "images" / "meshrun.sqsh"
    t0 = time.monotonic()
    built = subprocess.run(
        [sys.executable, "-m", "launcher.image", "build", "--base", BASE_IMAGE, "--out", "images/meshrun.sqsh",
         "--deps", "copy"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr + built.stdout
    print(f"\nimage build: {time.monotonic() - t0:.1f} s")
    record = json.loads(Path(str(out_image) + ".digest.json").read_text())
    assert record["digest"].startswith("sha256:") and record["python"] == "/usr/bin/python3"
    assert any(r.startswith("torch==") for r in record["requirements"])
    use = next(line for line in built.stdout.splitlines() if "use: " in line).split("use: ", 1)[1]
    assert use == f"cluster.container_image={out_image} cluster.container_python=/usr/bin/python3"

    run_dir = tmp_path / "run"
    cfg = compose([*BASE, "cluster.nodes=1", "cluster.gpus_per_node=2", "train.steps=5", "cluster.pyxis=true",
                   *use.split()])  # fmt: skip
    nccl.apply(cfg.cluster)
    spec = RunSpec(cfg, make_plan(cfg), str(run_dir))
    write_run_dir(spec)
    probe = "import sys, torch; print('INSIDE', sys.executable, torch.__file__, open('/etc/meshrun-image.json').read().replace(chr(10), ' '))"
    command = (
        f"bash -c {json.dumps(f'/usr/bin/python3 -c {json.dumps(probe)} && exec ' + task_command(spec))}"
    )
    job = _submit(spec, run_dir / "slurm", command, submitit_parameters(spec, str(run_dir / "slurm")))
    rec = wait_jobs([job], 240)[job]
    err = "".join(p.read_text()[-1500:] for p in (run_dir / "slurm").glob("*_log.err"))
    assert rec.state == "COMPLETED", (rec, err)
    for t in range(2):
        line = next(
            x for x in (run_dir / "slurm" / f"{job}_{t}_log.out").read_text().splitlines() if "INSIDE" in x
        )
        # The image's interpreter and its own copy of torch, and the image's manifest.
        assert "INSIDE /usr/bin/python3 /usr/local/lib/python3" in line and '"deps": "copy"' in line, line
    assert json.loads((run_dir / "result.json").read_text())["final_step"] == 5
    assert json.loads((run_dir / "container.json").read_text())["digest"] == record["digest"]


def test_image_pip_gets_index_credentials_from_the_environment_only(tmp_path: Path) -> None:
    """``meshrun image``'s pip step (launcher/slurm/imagebuild.py ``_pip_deps``) in a
    real Enroot container of the Debian base, this host's pip mounted in (the
    base has none): ``--pip-args`` with a token reaches pip (it installs from
    the wheel dir named by it) while no process's argv shows the token, nor
    the error of a failed install."""
    import threading
    import zipfile

    from launcher.slurm import imagebuild as image

    if not os.path.isfile(BASE_IMAGE):
        pytest.skip(f"no base image {BASE_IMAGE} (scripts/testcluster.sh start builds it)")
    token = "ghp_" + "Q1w2E3r4T5y6U7i8O9p0" * 2
    stage, wheels = tmp_path / "stage", tmp_path / "stage" / f"wheels-{token}"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "meshrunprobe-0.1-py3-none-any.whl", "w") as z:
        z.writestr("meshrunprobe.py", "OK = True\n")
        info = "meshrunprobe-0.1.dist-info"
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: meshrunprobe\nVersion: 0.1\n")
        z.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{info}/RECORD", "")
    (stage / "requirements.txt").write_text("meshrunprobe==0.1\n")
    pip_dir = Path(__import__("pip").__file__).parent
    name = f"meshrun-pipprobe-{os.getpid()}"
    subprocess.run(["enroot", "create", "--name", name, BASE_IMAGE], check=True, capture_output=True)
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:  # every argv on this host while pip runs
        while not done.is_set():
            for p in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    if token.encode() in p.read_bytes():
                        seen.append(p.read_bytes().decode(errors="replace"))
                except OSError:
                    pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        start = ["enroot", "start", "--rw", "--root", "--mount", f"{stage}:/meshrun-build",
                 "--mount", f"{pip_dir}:/usr/lib/python3/dist-packages/pip"]  # fmt: skip
        watcher.start()
        logs: list[str] = []
        # Debian marks its python externally managed (PEP 668): the flag passes through too.
        pip_args = f"--break-system-packages --no-index --find-links /meshrun-build/wheels-{token}"
        image._pip_deps(start, name, "python3", ["meshrunprobe==0.1"], (), pip_args, logs.append)
        done.set()
        watcher.join()
        assert seen == [], seen
        assert any("holds a credential" in line for line in logs), logs
        ok = subprocess.run([*start, name, "python3", "-c", "import meshrunprobe; print(meshrunprobe.OK)"],
                            capture_output=True, text=True)  # fmt: skip
        assert ok.stdout.strip() == "True", ok.stderr
        (stage / "requirements.txt").write_text("nosuchpkg==1\n")
        with pytest.raises(image.ImageError) as failed:  # not in the index: the error is masked
            image._pip_deps(
                start, name, "python3", ["nosuchpkg==1"], (), pip_args.replace("wheels", "no"), print
            )
        msg = str(failed.value)  # the command as run: the arguments by name only
        assert token not in msg and f"--env {image.PIP_ARGS_ENV} " in msg, msg
    finally:
        done.set()
        subprocess.run(["enroot", "remove", "--force", name], capture_output=True, check=False)
