"""Bad inputs a user could type are refused by validation and the planner,
one class at a time: credentials, memory, TP across nodes, preset conflicts,
the field to blame, ports, S3 bucket names, data paths, ranges and names.

Every refusal names the field and the value the user set (with the valid
choices or range), never echoes a credential, and happens before anything is
written. Most cases run ``compose`` + ``make_plan`` (what the CLI runs first);
a representative subset runs ``python -m launcher`` in a temporary cwd and
checks the exit code, no traceback and no credential in any file written.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_validation.py."""

from __future__ import annotations

import dataclasses

import pytest
from harness import refused

from launcher.config import secrets as secrets_module
from launcher.config.compose import compose
from launcher.config.schema import RunConfig
from launcher.config.secrets import find_credentials, mask, secret_env_name
from launcher.config.validate import RANGES, range_message
from launcher.plan.make import make_plan

# Fake credentials in the documented AWS example shapes (not real keys).
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
PASSWORD = "hunter2pw"


# (override, field named, the secret that must not be echoed)
SECRETS = [
    (f"+cluster.env.AWS_SECRET_ACCESS_KEY={PASSWORD}", "cluster.env.AWS_SECRET_ACCESS_KEY", PASSWORD),
    (f"+cluster.env.AWS_ACCESS_KEY_ID={AWS_ID}", "cluster.env.AWS_ACCESS_KEY_ID", AWS_ID),
    (f"+cluster.env.AWS_SESSION_TOKEN={PASSWORD}", "cluster.env.AWS_SESSION_TOKEN", PASSWORD),
    (f"+cluster.env.HF_TOKEN={PASSWORD}", "cluster.env.HF_TOKEN", PASSWORD),
    (f"+cluster.env.WANDB_API_KEY={PASSWORD}", "cluster.env.WANDB_API_KEY", PASSWORD),
    (f"+cluster.env.PGPASSWORD={PASSWORD}", "cluster.env.PGPASSWORD", PASSWORD),
    (f"+cluster.env.DB_PASSWD={PASSWORD}", "cluster.env.DB_PASSWD", PASSWORD),
    (f"+cluster.env.MY_CLIENT_SECRET={PASSWORD}", "cluster.env.MY_CLIENT_SECRET", PASSWORD),
    (f"+cluster.env.FOO={AWS_ID}", "cluster.env.FOO", AWS_ID),
    ("+cluster.env.FOO=ASIAY34FZKBOKMUTVV7A", "cluster.env.FOO", "ASIAY34FZKBOKMUTVV7A"),
    (f"+cluster.env.FOO='{AWS_SECRET}'", "cluster.env.FOO", AWS_SECRET),
    ("+cluster.env.GH=ghp_abcdefghijklmnopqrstuvwxyz0123456789", "cluster.env.GH", "ghp_abcdefghijklmnop"),
    ("+cluster.env.HUB=hf_abcdefghijklmnopqrstuvwxyz0123456789", "cluster.env.HUB", "hf_abcdefghijklmnop"),
    (
        f"storage.s3_endpoint_url='https://minio:{PASSWORD}@s3.example.org:9000'",
        "storage.s3_endpoint_url",
        PASSWORD,
    ),
    (f"storage.s3_endpoint_url='http://{PASSWORD}@127.0.0.1:9000'", "storage.s3_endpoint_url", PASSWORD),
    (
        f"storage.s3_endpoint_url='https://minio:{AWS_SECRET}@s3.example.org'",
        "storage.s3_endpoint_url",
        AWS_SECRET,
    ),
    (
        f"cluster.container_image='docker://me:{PASSWORD}@registry.example.org/img:1'",
        "cluster.container_image",
        PASSWORD,
    ),
    (f"data.path='https://u:{PASSWORD}@data.example.org/shards'", "data.path", PASSWORD),
    (f"storage.shared_dir='/lustre/{AWS_ID}/ckpt'", "storage.shared_dir", AWS_ID),
    (f"+cluster.container_mounts=['/data:/data','/x/{AWS_ID}:/k']", "cluster.container_mounts[1]", AWS_ID),
]


@pytest.mark.parametrize("stage", ["overrides", "config"])
@pytest.mark.parametrize(
    ("override", "field", "secret"), SECRETS, ids=[s[1] + ":" + s[0][:30] for s in SECRETS]
)
def test_credentials_are_refused_masked_with_where_they_go(
    override: str, field: str, secret: str, stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused twice over: in the override strings, before Hydra parses them
    (its errors repeat values), and in the composed config (a preset YAML or
    code can set them too) by validation."""
    if stage == "config":
        monkeypatch.setattr(secrets_module, "override_findings", lambda overrides: [])
    else:
        field = field.split("[")[0]  # the override sets the whole list
    msg = refused([override])
    assert msg.startswith(field + "="), msg
    assert secret not in msg, msg
    assert "***" in msg
    assert "AWS_PROFILE" in msg and "environment" in msg  # where credentials go instead


def test_credentials_in_code_set_values_are_found_too() -> None:
    # A private key pasted into an env value (not expressible as a Hydra override).
    def edit(cfg: RunConfig) -> None:
        cfg.cluster.env["SSH_ID"] = "-----BEGIN OPENSSH PRIVATE KEY-----\\nb3Blbn"

    msg = refused([], edit)
    assert "cluster.env.SSH_ID" in msg and "BEGIN" not in msg


@pytest.mark.parametrize(
    "override",
    [
        "+cluster.env.TOKENIZERS_PARALLELISM=false",
        "+cluster.env.AWS_PROFILE=research",
        "+cluster.env.AWS_SHARED_CREDENTIALS_FILE=/home/me/.aws/credentials",
        "+cluster.env.AWS_SECRET_ACCESS_KEY=",  # empty: unsets, holds nothing
        "+cluster.env.GIT_COMMIT=0123456789abcdef0123456789abcdef01234567",  # hex digest, not a key
        "storage.s3_endpoint_url=http://127.0.0.1:9000",
        "storage.s3_endpoint_url=https://s3.example.org:9000/path",
        "cluster.container_image='docker://nvcr.io/nvidia/pytorch@sha256:0123abcd' cluster.pyxis=true",
        "cluster.container_image='nvcr.io#nvidia/pytorch:25.01-py3' cluster.pyxis=true",
    ],
)
def test_look_alikes_are_accepted(override: str) -> None:
    cfg = compose(override.split())
    assert find_credentials(cfg) == []
    make_plan(cfg)


def test_mask_and_env_names() -> None:
    assert mask(f"https://u:{PASSWORD}@h/x") == "https://***@h/x"
    assert AWS_ID not in mask(f"id {AWS_ID} end")
    assert secret_env_name("AWS_SECRET_ACCESS_KEY") and secret_env_name("OPENAI_API_KEY")
    assert not secret_env_name("TOKENIZERS_PARALLELISM") and not secret_env_name("NCCL_IB_HCA")


def test_more_host_ram_lets_the_same_plan_fit() -> None:
    plan = make_plan(compose(["model=1b", "cluster=local", "cluster.mem_per_node_gb=512"]))
    assert plan.memory.fits and plan.memory.capacity_gb == 256


def test_fsdp_tp_without_a_usable_tp_degree_names_the_mode() -> None:
    msg = refused(["parallelism=fsdp_tp", "model.n_heads=1", "model.n_kv_heads=1"])
    assert msg.startswith("parallelism.mode='fsdp_tp' is invalid") and "parallelism=fsdp" in msg


@pytest.mark.parametrize(
    "override",
    [
        "launcher.master_port=70000",
        "launcher.master_port=80",
        "launcher.master_port=-1",
        "cluster.metrics_port=65536",
        "cluster.metrics_port=1000",
    ],
)
def test_ports_outside_the_tcp_range_are_refused(override: str) -> None:
    field, value = override.split("=")
    msg = refused([override])
    assert msg.startswith(f"{field}={value} is invalid"), msg
    assert "1024-65535" in msg and "or 0 to" in msg


@pytest.mark.parametrize(
    "override", ["launcher.master_port=29555", "launcher.master_port=0", "cluster.metrics_port=0"]
)
def test_valid_ports_are_accepted(override: str) -> None:
    make_plan(compose([override]))


def test_metrics_ports_leave_room_for_every_rank() -> None:
    msg = refused(["cluster.local_processes=4", "cluster.metrics_port=65534"])
    assert msg.startswith("cluster.metrics_port=65534 is invalid") and "<= 65532 with 4 ranks" in msg
    make_plan(compose(["cluster.local_processes=4", "cluster.metrics_port=65532"]))


BUCKETS = [
    ("My_Checkpoints", ["lower-case", "e.g. my-checkpoints"]),
    ("s3://team/llama", ["storage.s3_bucket=team storage.s3_prefix=llama"]),
    ("team/llama", ["storage.s3_bucket=team storage.s3_prefix=llama"]),
    ("s3://team", ["use storage.s3_bucket=team"]),
    ("ab", ["3-63 characters"]),
    ("a" * 64, ["3-63 characters"]),
    ("-ckpts", ["starting and ending with a letter or digit"]),
    ("ckpts.", ["starting and ending with a letter or digit"]),
    ("team..ckpts", ["no two adjacent '.'"]),
    ("192.168.1.10", ["IP address"]),
    ("xn--ckpts", ["reserves"]),
    ("ckpts-s3alias", ["reserves"]),
]


@pytest.mark.parametrize(("bucket", "expected"), BUCKETS, ids=[b for b, _ in BUCKETS])
def test_bucket_names_follow_s3_rules(bucket: str, expected: list[str]) -> None:
    msg = refused(["storage=nvme_s3", f"storage.s3_bucket='{bucket}'"])
    assert msg.startswith(f"storage.s3_bucket={bucket!r} is invalid"), msg
    for text in expected:
        assert text in msg, (text, msg)


@pytest.mark.parametrize("bucket", ["meshrun-ckpt", "team.data.2026", "abc"])
def test_valid_bucket_names_are_accepted(bucket: str) -> None:
    make_plan(compose(["storage=nvme_s3", f"storage.s3_bucket={bucket}"]))


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("storage.s3_prefix=/llama", "storage.s3_prefix"),
        ("storage.s3_prefix='team//llama'", "storage.s3_prefix"),
        ("storage.s3_endpoint_url=127.0.0.1:9000", "storage.s3_endpoint_url"),
        ("storage.s3_region='us east 1'", "storage.s3_region"),
    ],
)
def test_prefix_and_endpoint_shapes(override: str, field: str) -> None:
    msg = refused(["storage=nvme_s3", "storage.s3_bucket=ckpts", override])
    assert msg.startswith(field + "="), msg


def test_lr_zero_and_negative_get_the_same_rule() -> None:
    neg = refused(["train.lr=-0.001"])
    zero = refused(["train.lr=0"])
    assert neg.startswith("train.lr=-0.001 is invalid") and zero.startswith("train.lr=0.0 is invalid")
    assert neg.split(" is invalid: ")[1] == zero.split(" is invalid: ")[1] == "must be > 0"


def _bad_value(path: str) -> float:
    lo, inclusive, zero = RANGES[path]
    if inclusive:
        return -1 if zero or lo <= 0 else lo - 1
    return -1


@pytest.mark.parametrize("path", sorted(RANGES))
def test_every_range_rule_refuses_below_its_bound(path: str) -> None:
    group, name = path.split(".")
    kind = {f.name: f.type for f in dataclasses.fields(type(getattr(RunConfig(), group)))}[name]
    bad = _bad_value(path)
    value = str(int(bad)) if kind == "int" else str(float(bad))
    msg = refused([f"{path}={value}"])
    assert msg == f"{path}={int(bad) if kind == 'int' else float(bad)!r} is invalid: {range_message(path)}"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.lr=nan", "must be a finite number that must be > 0"),
        ("train.lr=inf", "must be a finite number"),
        ("parallelism.tp=-1", "must be >= 1, or 0 to let meshrun choose"),
        ("train.grad_clip=-1", "must be > 0, or 0 for no clipping"),
        ("train.min_lr_ratio=1.5", "must be >= 0 and <= 1"),
        ("qos.cluster_share_pct=150", "must be > 0 and <= 100"),
        ("storage.upload_part_mb=4", "must be >= 5"),
        ("train.steps=0", "must be >= 1"),
    ],
)
def test_range_messages(override: str, expected: str) -> None:
    msg = refused([override])
    assert msg.startswith(override.split("=")[0] + "="), msg
    assert expected in msg, msg


NAMES = [
    ("launcher", "job_name", "a\nsrun evil"),
    ("launcher", "job_name", "tab\there"),
    ("launcher", "job_name", "c1\x85control"),
    ("qos", "account", "team/../root"),
    ("qos", "partition", "gpu`id`"),
    ("qos", "qos", "high prio"),
    ("model", "name", "../../etc"),
    ("cluster", "name", "a|b"),
]


@pytest.mark.parametrize(("group", "name", "value"), NAMES, ids=[f"{g}.{n}={v!r}" for g, n, v in NAMES])
def test_names_must_have_a_safe_shape(group: str, name: str, value: str) -> None:
    msg = refused([], lambda cfg: setattr(getattr(cfg, group), name, value))
    assert msg.startswith(f"{group}.{name}={value!r} is invalid"), msg
    assert "\n" not in msg  # the value is shown escaped, on one line


def test_control_characters_are_refused_in_any_string() -> None:
    def edit(cfg: RunConfig) -> None:
        cfg.cluster.container_python = "python\nrm -rf ~"

    msg = refused([], edit)
    assert msg.startswith("cluster.container_python='python\\nrm -rf ~' is invalid") and "control" in msg


def test_env_names_must_be_shell_names() -> None:
    msg = refused(["+cluster.env.A-B=1"])
    assert msg.startswith("cluster.env.A-B is invalid")


def test_job_names_slurm_cannot_keep_are_refused() -> None:
    msg = refused([], lambda cfg: setattr(cfg.launcher, "job_name", "я" * 128))
    assert msg.startswith("launcher.job_name='яяя") and "256 bytes in UTF-8" in msg and "keeps 255" in msg
    make_plan(compose([f"launcher.job_name={'a' * 255}"]))  # the most Slurm keeps
    msg = refused([], lambda cfg: setattr(cfg.launcher, "job_name", "   "))
    assert msg.startswith("launcher.job_name='   ' is invalid: is only spaces")


def test_safe_names_are_accepted() -> None:
    make_plan(compose(["launcher.job_name=llama-7b_v2.1+sft", "qos.account=team-a.b"]))
    make_plan(compose(["launcher.job_name="]))  # the default: the run id is named <model>-<cluster>


def test_secret_env_names_are_what_slurm_is_not_given() -> None:
    """One list (launcher/config/secrets.py) for sbatch, the tasks and preflight."""
    from launcher.config.secrets import secret_env_names, without_secrets

    env = {
        "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "AWS_SESSION_TOKEN": "x",
        "AWS_SECURITY_TOKEN": "x",
        "HF_TOKEN": "hf_x",
        "DB_PASSWORD": "x",
        "PIP_INDEX_URL": "https://user:pw@pypi.example.org/simple",
        "HUB": "ghp_" + "a" * 36,
        "EMPTY_TOKEN": "",
        "AWS_PROFILE": "team",
        "AWS_SHARED_CREDENTIALS_FILE": "/home/u/.aws/credentials",
        "AWS_DEFAULT_REGION": "us-east-1",
        "TOKENIZERS_PARALLELISM": "false",
        "PATH": "/usr/bin",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "GIT_COMMIT": "0123456789abcdef0123456789abcdef01234567",
    }
    dropped = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"}
    dropped |= {"HF_TOKEN", "DB_PASSWORD", "PIP_INDEX_URL", "HUB"}
    assert secret_env_names(env) == sorted(dropped)
    assert without_secrets(env) == {k: v for k, v in env.items() if k not in dropped}
