"""Nothing a user types reaches the batch shell unquoted.

Every string field that lands in the sbatch script is set to hostile values
($(...), backticks, ';', '&&', '|', quotes, spaces, globs, variables) on an
otherwise valid spec; validation is bypassed on purpose (render must be safe
on its own). The rendered script must pass ``bash -n``, and running it with
fake ``srun`` / ``scontrol`` first on PATH (they record their argv and
environment) must create no marker file and deliver each value as one literal
argument, environment value or ``#SBATCH`` value. Values with a newline or
another control character are refused by render, naming the field.
"""

from __future__ import annotations

import copy
import functools
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from launcher.config import ncclenv as nccl
from launcher.config.compose import compose
from launcher.config.schema import RunConfig
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan
from launcher.slurm.render import render_array_sbatch, render_sbatch, script_strings

MARK = "@MARK@"  # replaced by the test's marker path
HOSTILE = [
    f"$(touch {MARK})",
    f"`touch {MARK}`",
    f"x; touch {MARK}",
    f"x && touch {MARK} #",
    f"x | touch {MARK}",
    f"it's \"quoted\" '$(touch {MARK})'",
    "two words  and\ttab-free spaces".replace("\t", " "),
    "$HOME ${PATH:-x} * ?",
]
# Every user string that reaches the script (launcher.slurm.render.script_strings).
FIELDS = [
    "launcher.job_name",
    "run_id",
    "qos.partition",
    "qos.qos",
    "qos.account",
    "launcher.run_dir",
    "cluster.container_image",
    "cluster.container_workdir",
    "cluster.container_python",
    "cluster.container_mounts",
    "cluster.env",
]

FAKE_SRUN = """#!/bin/bash
n=$(find "$REC" -name '*.argv' | wc -l)
printf '%s\\0' "$@" > "$REC/$n.argv"
printf '%s\\0' "$MESHRUN_RUN_DIR" "$PYTHONPATH" "${MESHRUN_T-unset}" > "$REC/$n.env"
exit 0
"""
FAKE_SCONTROL = """#!/bin/bash
case "$*" in
  "show hostnames"*) echo node1 ;;
  *"show node"*) echo "NodeName=node1 NodeAddr=127.0.0.1 State=IDLE" ;;
  *) echo "unexpected scontrol $*" >&2; exit 1 ;;
esac
"""


@functools.cache
def _base_cfg() -> RunConfig:
    cfg = compose(
        [
            "cluster=4node",
            "model=tiny",
            "cluster.preflight=true",
            "cluster.pyxis=true",
            "cluster.container_image=nvcr.io/nvidia/pytorch:25.01-py3",
        ]
    )
    nccl.apply(cfg.cluster)
    return cfg


def base_spec(run_dir: str) -> RunSpec:
    """A valid container run; each test edits one field of its own copy."""
    cfg = copy.deepcopy(_base_cfg())
    return RunSpec(cfg, make_plan(cfg), run_dir)


def set_field(spec: RunSpec, field: str, value: str) -> RunSpec:
    cfg = spec.cfg
    if field == "launcher.run_dir":
        spec.run_dir = value
    elif field == "run_id":  # read back from <run_dir>/run_id on a resume
        spec.run_id = value
    elif field == "cluster.container_mounts":
        cfg.cluster.container_mounts = ["/data:/data", value]
    elif field == "cluster.env":
        cfg.cluster.env = {**cfg.cluster.env, "MESHRUN_T": value}
    else:
        group, name = field.split(".")
        setattr(getattr(cfg, group), name, value)
    return spec


def sbatch_values(script: str) -> dict[str, str]:
    out = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            (flag,) = shlex.split(line[len("#SBATCH ") :])  # one word per flag, as sbatch reads it
            key, _, value = flag.partition("=")
            out[key] = value
    return out


def run_script(tmp: Path, script: str, **extra_env: str) -> list[tuple[list[str], list[str]]]:
    """Run the script as the batch shell would, with fake Slurm commands."""
    bindir, rec = tmp / "bin", tmp / "rec"
    bindir.mkdir()
    rec.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    path = tmp / "job.sh"
    path.write_text(script)
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "HOME": str(tmp),
        "REC": str(rec),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_JOB_NUM_NODES": "1",
        **extra_env,
    }
    proc = subprocess.run(["bash", str(path)], env=env, cwd=tmp, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    calls = []
    for i in range(len(list(rec.glob("*.argv")))):
        argv = (rec / f"{i}.argv").read_text().split("\0")[:-1]
        envs = (rec / f"{i}.env").read_text().split("\0")[:-1]
        calls.append((argv, envs))
    return calls


CASES = [(f, i) for f in FIELDS for i in range(len(HOSTILE))]


@pytest.mark.parametrize(("field", "i"), CASES, ids=[f"{f}-{i}" for f, i in CASES])
def test_hostile_value_stays_one_literal_word(tmp_path: Path, field: str, i: int) -> None:
    marker = tmp_path / "pwned"
    value = HOSTILE[i].replace(MARK, str(marker))
    if field == "launcher.run_dir":
        value = f"{tmp_path}/runs/{value}"
    spec = set_field(base_spec(str(tmp_path / "runs" / "r")), field, value)
    folder = f"{spec.run_dir}/slurm"
    assert value in [v for _, v in script_strings(spec, folder)]  # the list the render check covers
    script = render_sbatch(spec, folder, code_dir="/opt/meshrun")
    syntax = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert syntax.returncode == 0, syntax.stderr

    calls = run_script(tmp_path, script)
    assert not marker.exists(), f"{field}={value!r} executed in the batch shell"
    assert len(calls) == 3, calls  # preflight per node, all-reduce, training
    flags = sbatch_values(script)
    train_argv, (run_dir_env, pythonpath, env_t) = calls[-1]
    assert train_argv[-5:] == [
        spec.cfg.cluster.container_python,
        "-u",
        "-m",
        "train",
        spec.run_dir,
    ]
    if field in ("launcher.job_name", "run_id"):
        assert flags["--job-name"] == value
    elif field.startswith("qos."):
        assert flags["--" + field.split(".")[1]] == value
    elif field == "launcher.run_dir":
        assert run_dir_env == value
        assert flags["--comment"] == f"meshrun run_dir={value}"
        assert flags["--output"].startswith(f"{value}/slurm/")
        assert f"--output={value}/slurm/" not in script  # quoted, not bare
    elif field == "cluster.container_image":
        assert all(f"--container-image={value}" in argv for argv, _ in calls)
    elif field == "cluster.container_workdir":
        assert all(f"--container-workdir={value}" in argv for argv, _ in calls)
        assert pythonpath.startswith(value)
    elif field == "cluster.container_python":
        assert all(value in argv for argv, _ in calls)
    elif field == "cluster.container_mounts":
        (mounts,) = [a for a in train_argv if a.startswith("--container-mounts=")]
        assert mounts.endswith("," + value)
    elif field == "cluster.env":
        assert env_t == value


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize(
    "bad", ["x\ntouch /tmp/pwn", "x\rY", "x\x1b[2J", "x\x00y"], ids=["nl", "cr", "esc", "nul"]
)
def test_control_characters_are_refused_naming_the_field(tmp_path: Path, field: str, bad: str) -> None:
    if field == "launcher.run_dir":
        bad = f"{tmp_path}/{bad}"
    spec = set_field(base_spec(str(tmp_path / "r")), field, bad)
    with pytest.raises(ConfigError) as info:
        render_sbatch(spec, f"{spec.run_dir}/slurm", code_dir="/opt/meshrun")
    msg = str(info.value)
    assert field in msg and "control characters" in msg, msg


@pytest.mark.parametrize("key", ["A;touch /tmp/pwn", "$(x)", "1ABC", "A B", "A=B", ""])
def test_env_names_must_be_shell_names(tmp_path: Path, key: str) -> None:
    spec = base_spec(str(tmp_path / "r"))
    spec.cfg.cluster.env = {key: "v"}
    with pytest.raises(ConfigError) as info:
        render_sbatch(spec, f"{spec.run_dir}/slurm", code_dir="/opt/meshrun")
    assert "cluster.env" in str(info.value) and repr(key) in str(info.value)


def test_without_a_container_the_interpreter_is_quoted_too(tmp_path: Path) -> None:
    spec = base_spec(str(tmp_path / "it's here"))
    spec.cfg.cluster.container_image = ""
    script = render_sbatch(spec, f"{spec.run_dir}/slurm", code_dir="/opt/meshrun")
    assert subprocess.run(["bash", "-n"], input=script, text=True, timeout=30).returncode == 0
    calls = run_script(tmp_path, script)
    assert calls[-1][0][-1] == spec.run_dir
    assert os.path.isabs(calls[-1][0][-5])


@pytest.mark.parametrize("i", range(len(HOSTILE)))
def test_job_array_run_dirs_stay_literal(tmp_path: Path, i: int) -> None:
    """A sweep's job array lists every point's run dir in the script; task 1
    must get its own hostile dir as one word."""
    marker = tmp_path / "pwned"
    sweep = tmp_path / "sweep"
    dirs = [f"{sweep}/0", f"{sweep}/" + HOSTILE[i].replace(MARK, str(marker))]
    specs = [base_spec(d) for d in dirs]
    script = render_array_sbatch(specs, f"{sweep}/slurm", code_dir="/opt/meshrun")
    assert subprocess.run(["bash", "-n"], input=script, text=True, timeout=30).returncode == 0
    calls = run_script(tmp_path, script, SLURM_ARRAY_TASK_ID="1")
    assert not marker.exists()
    argv, (run_dir_env, _, _) = calls[-1]
    assert argv[-1] == dirs[1] and run_dir_env == dirs[1]


def test_job_array_refuses_a_run_dir_with_a_newline(tmp_path: Path) -> None:
    specs = [base_spec(str(tmp_path / "0")), base_spec(f"{tmp_path}/x\ntouch /tmp/pwn")]
    with pytest.raises(ConfigError, match="launcher.run_dir.*control characters"):
        render_array_sbatch(specs, f"{tmp_path}/slurm", code_dir="/opt/meshrun")
