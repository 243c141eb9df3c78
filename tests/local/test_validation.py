"""Bad inputs a user could type are refused by validation and the planner,
one class at a time: credentials, memory, TP across nodes, preset conflicts,
the field to blame, ports, S3 bucket names, data paths, ranges and names.

Every refusal names the field and the value the user set (with the valid
choices or range), never echoes a credential, and happens before anything is
written. Most cases run ``compose`` + ``make_plan`` (what the CLI runs first);
a representative subset runs ``python -m launcher`` in a temporary cwd and
checks the exit code, no traceback and no credential in any file written.
Tests that start no process: tests/unit/test_validation_units.py."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from harness import refused

from launcher.config.compose import compose
from launcher.plan.make import make_plan

REPO = Path(__file__).resolve().parents[2]

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def launcher(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, module: str = "launcher"
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), full_env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env=full_env,
    )


def files_containing(root: Path, secret: str) -> list[Path]:
    """Every file under root whose bytes contain secret."""
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and secret.encode() in path.read_bytes():
            hits.append(path)
    return hits


# --- credentials ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        [f"+cluster.env.AWS_SECRET_ACCESS_KEY={AWS_SECRET}", "launcher.dry_run=true"],
        [f"storage.s3_endpoint_url='https://minio:{AWS_SECRET}@s3.example.org'"],
        ["cluster=4node", f"+cluster.env.FOO={AWS_SECRET}", "launcher.dry_run=true"],
        [f"cluster.env.AWS_SECRET_ACCESS_KEY={AWS_SECRET}"],
        ["-m", f"+cluster.env.HF_TOKEN={AWS_SECRET}", "train.lr=0.001,0.002"],
    ],
    ids=["env-dry-run", "endpoint-local-run", "slurm-dry-run", "env-without-plus", "sweep"],
)
def test_cli_refuses_credentials_and_writes_none(args: list[str], tmp_path: Path) -> None:
    # Also without '+' (Hydra's own error would repeat the value) and in sweeps.
    p = launcher(args, tmp_path)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert "is refused" in p.stderr and "AWS_PROFILE" in p.stderr
    assert AWS_SECRET not in p.stdout + p.stderr
    assert files_containing(tmp_path, AWS_SECRET) == []


def test_meshrun_run_refuses_credentials_before_hydra(tmp_path: Path) -> None:
    p = launcher(["run", f"cluster.env.HF_TOKEN={AWS_SECRET}"], tmp_path, module="launcher.cli")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "cluster.env.HF_TOKEN='***' is refused" in p.stderr
    assert AWS_SECRET not in p.stdout + p.stderr
    assert list(tmp_path.iterdir()) == []  # Hydra never ran: no runs/ dir


def test_credentials_from_the_environment_reach_no_file(tmp_path: Path) -> None:
    """The sanctioned way: a credential in the environment that runs meshrun
    is used by the tasks but written to no file of the run."""
    run_dir = tmp_path / "run"
    p = launcher(
        ["train.steps=2", "train.log_every_steps=1", f"launcher.run_dir={run_dir}"],
        tmp_path,
        env={"AWS_SECRET_ACCESS_KEY": AWS_SECRET, "OMP_NUM_THREADS": "1"},
    )
    assert p.returncode == 0, p.stderr
    assert (run_dir / "result.json").exists()
    assert AWS_SECRET not in p.stdout + p.stderr
    assert files_containing(tmp_path, AWS_SECRET) == []


# --- memory ----------------------------------------------------------------------------------------

MEMORY = [
    # (overrides, what the message must name)
    (
        ["model=13b", "cluster=local"],
        ["per CPU rank", "cluster.mem_per_node_gb=24", "Biggest term: optimizer state"],
    ),
    (["model=1b", "cluster=local"], ["per CPU rank", "Biggest term: activations", "train.micro_batch_size"]),
    (["model=7b", "cluster=local", "cluster.local_processes=4"], ["per CPU rank", "6.0 GB each"]),
    (
        ["model=70b", "cluster=testcluster"],
        ["per CPU rank", "cluster.mem_per_node_gb=256", "Biggest term"],
    ),
    (["model=405b", "cluster=1node"], ["per GPU", "80 GB GPUs", "Biggest term: optimizer state", ">= 32"]),
    (["model=70b", "cluster=1node_a100"], ["per GPU", "cluster.gpu_mem_gb", "Biggest term"]),
    (
        ["model=70b", "cluster=1node", "parallelism.tp=1"],
        ["per GPU", "Biggest term: optimizer state", "parallelism.tp or parallelism.pp"],
    ),
    (
        [
            "model=7b",
            "cluster=1node",
            "model.seq_len=262144",
            "train.global_batch_size=8",
            "parallelism.activation_checkpointing=none",
        ],
        ["Biggest term: activations", "activation_checkpointing=full"],
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), MEMORY, ids=[" ".join(o) for o, _ in MEMORY])
def test_plans_over_the_device_memory_are_refused(overrides: list[str], expected: list[str]) -> None:
    msg = refused(overrides)
    assert "does not fit" in msg
    for text in expected:
        assert text in msg, (text, msg)


def test_cli_refuses_a_plan_bigger_than_the_host(tmp_path: Path) -> None:
    p = launcher(["model=13b", "cluster=local", "launcher.dry_run=true"], tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "model=13b does not fit" in p.stderr and "cluster.mem_per_node_gb" in p.stderr


# --- tensor parallel stays inside a node -----------------------------------------------------------

TP_NODE = [
    (["model=7b", "cluster=4node", "cluster.gpus_per_node=6", "parallelism.tp=4"], "cluster.gpus_per_node=6"),
    (["model=7b", "cluster=local", "cluster.gpus_per_node=6", "parallelism.tp=4"], "cluster.gpus_per_node=6"),
    (["model=7b", "cluster=2node", "cluster.gpus_per_node=4", "parallelism.tp=8"], "cluster.gpus_per_node=4"),
    (
        ["cluster=testcluster", "model.n_heads=16", "model.dim=128", "parallelism.tp=16"],
        "cluster.gpus_per_node=8",
    ),
    (["cluster.local_processes=3", "parallelism.tp=2"], "cluster.local_processes=3"),
]


@pytest.mark.parametrize(("overrides", "node_field"), TP_NODE, ids=[" ".join(o) for o, _ in TP_NODE])
def test_tp_never_crosses_a_node(overrides: list[str], node_field: str) -> None:
    tp = next(o for o in overrides if o.startswith("parallelism.tp="))
    msg = refused(overrides)
    assert msg.startswith(tp + " is invalid"), msg
    assert node_field in msg and "choose parallelism.tp from" in msg


def test_tp_that_divides_the_node_is_accepted() -> None:
    plan = make_plan(compose(["model=7b", "cluster=4node", "cluster.gpus_per_node=6", "parallelism.tp=2"]))
    assert plan.tp == 2 and plan.ranks_per_node % plan.tp == 0


# --- an explicit preset keeps its meaning ----------------------------------------------------------

PRESETS = [
    (["parallelism=fsdp", "parallelism.tp=8", "model=7b", "cluster=1node"], "parallelism.tp=8", "fsdp_tp"),
    (["parallelism=fsdp", "parallelism.pp=2", "cluster=2node"], "parallelism.pp=2", "fsdp_tp_pp"),
    (
        ["parallelism=fsdp", "parallelism.dp_replicate=2", "cluster=2node"],
        "parallelism.dp_replicate=2",
        "hsdp",
    ),
    (["parallelism=hsdp", "parallelism.tp=2", "cluster=2node"], "parallelism.tp=2", "fsdp_tp"),
    (["parallelism=hsdp", "parallelism.pp=2", "cluster=2node"], "parallelism.pp=2", "fsdp_tp_pp"),
    (
        ["parallelism=fsdp_tp", "parallelism.pp=2", "model=7b", "cluster=2node"],
        "parallelism.pp=2",
        "fsdp_tp_pp",
    ),
    (["parallelism=fsdp_tp", "parallelism.tp=1", "model=7b", "cluster=2node"], "parallelism.tp=1", "fsdp"),
    (
        ["parallelism=fsdp_tp_pp", "parallelism.pp=1", "model=70b", "cluster=8node"],
        "parallelism.pp=1",
        "fsdp_tp",
    ),
    (
        ["parallelism.mode=fsdp", "parallelism.tp=2", "cluster.local_processes=4"],
        "parallelism.tp=2",
        "fsdp_tp",
    ),
]


@pytest.mark.parametrize(("overrides", "field", "instead"), PRESETS, ids=[" ".join(o) for o, *_ in PRESETS])
def test_explicit_preset_conflicts_are_refused(overrides: list[str], field: str, instead: str) -> None:
    msg = refused(overrides)
    assert msg.startswith(field + " conflicts with parallelism.mode="), msg
    assert f"parallelism={instead} " in msg


@pytest.mark.parametrize(
    ("overrides", "mode"),
    [
        (["parallelism=fsdp", "model=7b", "cluster=2node"], "fsdp"),
        (["parallelism=hsdp", "cluster=2node"], "hsdp"),
        (["parallelism=fsdp_tp", "model=7b", "cluster=2node"], "fsdp_tp"),
    ],
)
def test_explicit_preset_is_kept(overrides: list[str], mode: str) -> None:
    assert make_plan(compose(overrides)).mode == mode


# --- the error names the field the user set --------------------------------------------------------

BLAME = [
    (["model=13b", "cluster=1node", "parallelism.pp=100"], "parallelism.pp=100", ["model.n_layers=40"]),
    (["model=13b", "parallelism.pp=100"], "parallelism.pp=100", ["model.n_layers=40"]),
    (
        ["cluster.local_processes=4", "model.n_layers=8", "parallelism.pp=3"],
        "parallelism.tp=1 (chosen by the planner) x parallelism.pp=3",
        ["must divide the 4 ranks"],
    ),
    (
        ["model=7b", "cluster=1node", "parallelism.tp=3"],
        "parallelism.tp=3",
        ["cluster.gpus_per_node=8", "model.n_heads=32", "1, 2, 4, 8"],
    ),
    (
        ["cluster.local_processes=4", "parallelism.pp=2", "parallelism.stages_per_rank=3"],
        "parallelism.pp=2",
        ["pp x stages_per_rank = 6", "model.n_layers=4"],
    ),
]


@pytest.mark.parametrize(("overrides", "head", "expected"), BLAME, ids=[" ".join(o) for o, *_ in BLAME])
def test_errors_name_the_field_the_user_set(overrides: list[str], head: str, expected: list[str]) -> None:
    msg = refused(overrides)
    assert msg.startswith(head), msg
    for text in expected:
        assert text in msg, (text, msg)


def test_cli_names_pp_not_tp(tmp_path: Path) -> None:
    p = launcher(["model=13b", "cluster=1node", "parallelism.pp=100", "launcher.dry_run=true"], tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "parallelism.pp=100" in p.stderr and "model.n_layers=40" in p.stderr
    assert "parallelism.tp" not in p.stderr


# --- ports -----------------------------------------------------------------------------------------


def test_cli_refuses_a_port_without_traceback(tmp_path: Path) -> None:
    p = launcher(["launcher.master_port=70000"], tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "launcher.master_port=70000" in p.stderr and "1024-65535" in p.stderr


# --- S3 bucket names -------------------------------------------------------------------------------


def test_cli_bucket_url_gets_a_hint(tmp_path: Path) -> None:
    p = launcher(["storage=nvme_s3", "storage.s3_bucket=s3://team/llama", "launcher.dry_run=true"], tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "storage.s3_bucket=team storage.s3_prefix=llama" in p.stderr


# --- data paths, dry runs included -----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["data=tokens", "launcher.dry_run=true"],
        ["data=images", "model=vit_tiny", "launcher.dry_run=true"],
        ["data=tokens"],
    ],
    ids=["tokens-dry-run", "images-dry-run", "tokens-run"],
)
def test_missing_data_path_is_refused_in_dry_runs_too(args: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-data"
    p = launcher([*args, f"data.path={missing}", f"launcher.run_dir={tmp_path / 'run'}"], tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    assert "data" in p.stderr and str(missing) in p.stderr
    assert not (tmp_path / "run").exists()
    assert "dry run" not in p.stdout  # refused before the plan is printed


# --- ranges: one rule, one message -----------------------------------------------------------------


# --- names that reach the batch script, Slurm or a path --------------------------------------------

# A Slurm job name is free text: Slurm takes spaces, any script, quotes and
# '|'; meshrun quotes it wherever it reaches sbatch or a shell.
FREE_JOB_NAMES = ["my llama run", "обучение-λ", "x;touch pwned", "$(touch pwned)", 'it\'s "q" | a,b %j']


@pytest.mark.parametrize("name", FREE_JOB_NAMES)
def test_free_text_job_names_are_accepted_and_reach_sbatch_as_typed(tmp_path: Path, name: str) -> None:
    from launcher.config.spec import RunSpec
    from launcher.slurm.render import render_sbatch

    cfg = compose(["cluster=testcluster", "model=tiny"])
    cfg.launcher.job_name = name
    spec = RunSpec(cfg, make_plan(cfg), str(tmp_path / "r"), run_id="tiny-testcluster-20261201T000000Z-aaaa")
    script = render_sbatch(spec, str(tmp_path / "r" / "slurm"))
    (line,) = [ln for ln in script.splitlines() if ln.startswith("#SBATCH --job-name=")]
    assert shlex.split(line[len("#SBATCH ") :]) == [f"--job-name={name}"]  # one word, as typed
    assert subprocess.run(["bash", "-n"], input=script, text=True, timeout=30).returncode == 0


def test_cli_accepts_spaced_and_non_latin_job_names(tmp_path: Path) -> None:
    for name in ("my llama run", "обучение-λ"):
        p = launcher(
            [
                "cluster=4node",
                f'launcher.job_name="{name}"',
                "launcher.dry_run=true",
                f"launcher.run_dir={tmp_path}/r",
            ],
            tmp_path,
        )
        assert p.returncode == 0, p.stderr
        assert f"#SBATCH --job-name={shlex.quote(name)}\n" in p.stdout
        assert not (tmp_path / "r").exists()


# --- refused as typed (no request is resized first) ------------------------------------------------


def test_dp_shard_that_does_not_divide_the_node_is_refused_as_typed() -> None:
    """cluster=1node is 8 GPUs; dp_shard=3 passed only while the request was
    shrunk to a 3-GPU QOS share first."""
    msg = refused(["cluster=1node", "parallelism.dp_shard=3"])
    assert msg.startswith("parallelism='dp_replicate=0 dp_shard=3 tp=1 pp=1' is invalid"), msg
    assert "the 8 ranks of the cluster" in msg


def test_time_limit_too_short_for_the_planned_lead_is_refused_as_typed() -> None:
    """The planned USR2 lead (120 s) is not halved to fit a 1-minute limit."""
    msg = refused(["cluster=testcluster", "qos.time_limit_min=1"])
    assert msg.startswith("qos.time_limit_min=1 is invalid: a 60 s time limit leaves no room"), msg
    assert "planned 120 s signal lead" in msg and "set qos.time_limit_min>=3" in msg
    assert "or launcher.signal_lead_s=N with" in msg
    refused(["cluster=testcluster", "qos.time_limit_min=2"])  # 120 s: the signal would come at the start
    # A lead the user types is taken as typed when it fits.
    plan = make_plan(compose(["cluster=testcluster", "qos.time_limit_min=1", "launcher.signal_lead_s=30"]))
    assert plan.signal_lead_s == 30
    assert make_plan(compose(["cluster=testcluster", "qos.time_limit_min=3"])).signal_lead_s == 120


@pytest.mark.parametrize(
    "args, field, expected",
    [
        (
            ["storage.s3_credentials=env"],
            "storage.s3_credentials",
            "the environment (env) is for cluster=local only",
        ),
        (
            ["storage.s3_credentials=file"],
            "storage.s3_credentials_file",
            "storage.s3_credentials=file needs it",
        ),
        (["storage.s3_credentials_file=aws/credentials"], "storage.s3_credentials_file", "an absolute path"),
        (
            ["storage.s3_credentials_file=/nonexistent/c"],
            "storage.s3_credentials_file",
            "no readable file there",
        ),
        (
            ["storage.s3_credentials=role", "storage.s3_credentials_file=@FILE@"],
            "storage.s3_credentials_file",
            "unused with storage.s3_credentials=role",
        ),
    ],
)
def test_s3_credentials_source_is_checked(tmp_path: Path, args: list[str], field: str, expected: str) -> None:
    creds = tmp_path / "credentials"
    creds.write_text("[default]\n")
    creds.chmod(0o600)
    args = [a.replace("@FILE@", str(creds)) for a in args]
    msg = refused(["cluster=testcluster", "model=tiny", "storage=nvme_s3", "storage.s3_bucket=ckpts", *args])
    assert msg.startswith(f"{field}=") and expected in msg, msg


def test_s3_credentials_sources_that_keep_keys_out_of_slurm(tmp_path: Path) -> None:
    """A file (mode 600) or a role on Slurm; the environment on cluster=local."""
    from launcher.config.validate import s3_credentials_file, s3_credentials_source

    creds = tmp_path / "credentials"
    creds.write_text("[default]\n")
    creds.chmod(0o600)
    s3 = ["storage=nvme_s3", "storage.s3_bucket=ckpts"]
    slurm = ["cluster=testcluster", "model=tiny", *s3]
    cfg = compose([*slurm, f"storage.s3_credentials_file={creds}"])
    make_plan(cfg)
    assert (s3_credentials_source(cfg), s3_credentials_file(cfg)) == ("file", str(creds))
    cfg = compose([*slurm, "storage.s3_credentials=role"])
    make_plan(cfg)
    assert (s3_credentials_source(cfg), s3_credentials_file(cfg)) == ("role", "")
    cfg = compose(["model=tiny", *s3])
    make_plan(cfg)
    assert s3_credentials_source(cfg) == "env"
