"""Field-level checks on a composed run, before any planning.

Every failure is a :class:`ConfigError` naming the field, the bad value and
the valid choices or range, so the CLI can print one line and exit non-zero.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
import unicodedata
from typing import Any

from launcher.config.saveauto import AUTO, steps_value
from launcher.config.schema import RunConfig
from launcher.config.secrets import find_credentials, refusal
from launcher.config.secrets import strings as _all_strings


class ConfigError(ValueError):
    """A user error in the composed configuration."""


def fail(field: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{field}={value!r} is invalid: {expected}")


# Range rules, one per numeric field: (lower bound, bound included, what 0
# means when 0 is allowed below the bound). One rule gives one message:
# "must be >= 1", "must be > 0", or "must be >= 1, or 0 to let meshrun choose".
CHOOSE = "to let meshrun choose"
RANGES: dict[str, tuple[float, bool, str | None]] = {
    "cluster.nodes": (1, True, None),
    "cluster.cluster_nodes": (1, True, "for cluster.nodes"),
    "cluster.gpus_per_node": (1, True, "for CPU ranks (cluster=local)"),
    "cluster.node_gpus": (1, True, "for cluster.gpus_per_node"),
    "cluster.local_processes": (1, True, None),
    "cluster.gpu_mem_gb": (0, False, "when unknown (cluster=local)"),
    "cluster.gpu_peak_bf16_tflops": (0, False, "when unknown (no MFU)"),
    "cluster.intra_node_bandwidth_gb_per_s": (0, False, "when unknown"),
    "cluster.fabric_adapters_per_node": (1, True, "for none"),
    "cluster.fabric_adapter_gbit_per_s": (0, False, "when unknown"),
    "cluster.cpus_per_node": (1, True, None),
    "cluster.mem_per_node_gb": (0, False, None),
    "cluster.scratch_tb": (0, False, "when unknown"),
    "cluster.expected_busbw_gb_per_s": (0, False, "for the fabric preset's value"),
    "cluster.preflight_allreduce_mb": (0, False, CHOOSE),
    "cluster.preflight_min_free_gb": (0, False, "for no extra space"),
    "cluster.metrics_comm_sample_every": (1, True, "to turn sampling off"),
    "cluster.price_on_demand_usd_per_node_hour": (0, False, "when unknown"),
    "cluster.price_reserved_usd_per_node_year": (0, False, "when unknown"),
    "cluster.price_onprem_tco_usd_per_node_3yr": (0, False, "when unknown"),
    "cluster.gpu_h_per_failure": (0, False, "for the published prior (Meta: 7.9 h MTTF at 1,024 GPUs)"),
    "model.dim": (1, True, None),
    "model.n_layers": (1, True, None),
    "model.n_heads": (1, True, None),
    "model.n_kv_heads": (1, True, None),
    "model.ffn_dim": (1, True, None),
    "model.vocab_size": (1, True, None),
    "model.seq_len": (1, True, None),
    "model.norm_eps": (0, False, None),
    "model.rope_theta": (0, False, None),
    "model.image_size": (1, True, None),
    "model.patch_size": (1, True, None),
    "model.num_classes": (1, True, None),
    "parallelism.dp_replicate": (1, True, CHOOSE),
    "parallelism.dp_shard": (1, True, CHOOSE),
    "parallelism.tp": (1, True, CHOOSE),
    "parallelism.pp": (1, True, CHOOSE),
    "parallelism.cp": (1, True, CHOOSE),
    "parallelism.pp_microbatches": (1, True, CHOOSE),
    "parallelism.stages_per_rank": (1, True, None),
    "storage.save_every_min": (0, False, "to save by steps only"),
    "storage.keep_local": (1, True, None),
    "storage.keep_remote": (1, True, None),
    "storage.upload_timeout_min": (0, False, "to not wait for uploads at exit"),
    "storage.upload_threads": (1, True, None),
    "storage.upload_part_mb": (5, True, None),  # S3's smallest multipart part
    "storage.upload_retry_max_s": (0, False, None),
    "qos.time_limit_min": (1, True, None),
    "launcher.code_max_mb": (0, False, None),
    "qos.cluster_share_pct": (0, False, None),
    "qos.priority": (0, True, None),
    "qos.grace_time_s": (0, True, None),
    "data.num_workers": (0, True, None),
    "data.bad_sample_limit": (0, True, None),
    "train.steps": (1, True, None),
    "train.global_batch_size": (1, True, CHOOSE),
    "train.micro_batch_size": (1, True, CHOOSE),
    "train.lr": (0, False, None),  # used as given: 0 would never train
    "train.min_lr_ratio": (0, True, None),
    "train.warmup_steps": (0, True, None),
    "train.weight_decay": (0, True, None),
    "train.grad_clip": (0, False, "for no clipping"),
    "train.log_every_steps": (1, True, None),
    "train.target_tokens": (0, False, "for steps x batch x seq_len"),
    "launcher.max_restarts": (0, True, None),
    "launcher.signal_lead_s": (0, True, None),
    "launcher.hang_timeout_s": (
        0,
        False,
        "for 20x the measured (before that: predicted) step time, at least 120 s",
    ),
    "launcher.hang_startup_timeout_s": (0, False, "for 900 s"),
    "launcher.bad_node_faults": (1, True, None),
    "launcher.bad_node_window_h": (0, False, None),
    "launcher.budget_usd": (0, False, "for no budget"),
    "launcher.straggler_threshold": (1, False, None),  # a ratio to the peers' median
    "launcher.straggler_window": (1, True, None),
    "launcher.straggler_min_slow": (1, True, None),
    "launcher.straggler_probe_every_steps": (1, True, None),
    "launcher.peer_copy_every_steps": (1, True, None),
    "launcher.max_replacements": (0, True, None),
    "launcher.in_process_collective_timeout_s": (1, False, None),
    "launcher.burnin_passes": (2, True, None),
    "launcher.burnin_interval_s": (1, True, None),
    "cluster.spare_nodes": (0, True, None),
    "launcher.cpus_per_task": (1, True, CHOOSE),
    "launcher.mem_gb": (1, True, CHOOSE),
}
# Upper bounds, for the few fields that have one.
MAXIMA: dict[str, float] = {"train.min_lr_ratio": 1, "qos.cluster_share_pct": 100}
PORT_MIN, PORT_MAX = 1024, 65535  # below 1024 needs root; 65535 is TCP's last

# Names that reach the sbatch script, Slurm or a path: a safe shape only.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
NAME_RULE = "1-128 characters: letters, digits, '.', '_', '+', '-' (starting with a letter or digit)"
NAME_FIELDS = [
    "qos.name",
    "qos.partition",
    "qos.qos",
    "qos.account",
    "cluster.name",
    "cluster.gpu_type",
    "model.name",
    "parallelism.name",
    "storage.name",
    "data.name",
]
OPTIONAL_NAMES: set[str] = set()  # name fields where empty means "derive it"
# The Slurm job name is free text: spaces, any script, quotes, '|' (quoted
# wherever it reaches sbatch or a shell). Refused only: control characters
# (any string), and more than Slurm keeps: sbatch refuses a name over 1024
# bytes, and the accounting database (sacct) keeps its first 255.
JOB_NAME_MAX_BYTES = 255
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# S3 bucket naming rules (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html).
BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
BUCKET_RULE = (
    "S3 bucket names are 3-63 characters of lower-case letters, digits, '.' and '-', "
    "starting and ending with a letter or digit"
)
BUCKET_BAD_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
BUCKET_BAD_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def _get(cfg: RunConfig, path: str) -> Any:
    group, name = path.split(".")
    return getattr(getattr(cfg, group), name)


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def range_message(path: str) -> str:
    lo, inclusive, zero = RANGES[path]
    rule = f"must be {'>=' if inclusive else '>'} {_num(lo)}"
    if path in MAXIMA:
        rule += f" and <= {_num(MAXIMA[path])}"
    return rule + (f", or 0 {zero}" if zero else "")


def check_choices(cfg: RunConfig) -> None:
    """Mode fields carry their valid values in dataclass metadata."""
    for group in dataclasses.fields(cfg):
        node = getattr(cfg, group.name)
        for f in dataclasses.fields(node):
            choices = f.metadata.get("choices")
            value = getattr(node, f.name)
            if choices and value not in choices:
                raise fail(f"{group.name}.{f.name}", value, f"choose one of {', '.join(choices)}")


def check_ranges(cfg: RunConfig) -> None:
    for path, (lo, inclusive, zero) in RANGES.items():
        value = _get(cfg, path)
        if isinstance(value, float) and not math.isfinite(value):
            raise fail(path, value, f"must be a finite number that {range_message(path)}")
        ok = value >= lo if inclusive else value > lo
        ok = ok or (zero is not None and value == 0)
        if not ok or value > MAXIMA.get(path, math.inf):
            raise fail(path, value, range_message(path))
    for path in ("launcher.master_port", "cluster.metrics_port"):
        port = _get(cfg, path)
        if port != 0 and not PORT_MIN <= port <= PORT_MAX:
            # metrics_port is the first of one port per local rank.
            raise fail(path, port, f"must be a TCP port {PORT_MIN}-{PORT_MAX}, or 0 {PORT_ZERO[path]}")


PORT_ZERO = {
    "launcher.master_port": "to derive it from the Slurm job id (a free port locally)",
    "cluster.metrics_port": "to turn the Prometheus exporters off",
}


def check_credentials(cfg: RunConfig) -> None:
    """First of all checks: no later message may echo a credential."""
    found = find_credentials(cfg)
    if found:
        raise ConfigError(refusal(found[0]))


def check_strings(cfg: RunConfig) -> None:
    """Every string is one line of printable text, and names that reach the
    sbatch script, Slurm or a path have a safe shape."""
    for path, value, _ in _all_strings(cfg):
        if CONTROL.search(value):
            raise fail(path, value, "must not contain control characters (newline, tab, escape, NUL)")
    job_name = cfg.launcher.job_name
    if any(unicodedata.category(ch) == "Cc" for ch in job_name):  # C1 controls too
        raise fail("launcher.job_name", job_name, "must not contain control characters")
    if len(job_name.encode()) > JOB_NAME_MAX_BYTES:
        raise fail(
            "launcher.job_name",
            job_name,
            f"is {len(job_name.encode())} bytes in UTF-8; Slurm's accounting (sacct) keeps {JOB_NAME_MAX_BYTES} "
            "bytes of a job name (sbatch refuses over 1024): use a shorter name",
        )
    if job_name and not job_name.strip():
        raise fail(
            "launcher.job_name",
            job_name,
            "is only spaces: give a name, or leave it empty for <model>-<cluster>",
        )
    for path in NAME_FIELDS:
        value = _get(cfg, path)
        if not NAME.match(value) and not (value == "" and path in OPTIONAL_NAMES):
            raise fail(path, value, f"must be a plain name: {NAME_RULE}")
    for i, name in enumerate(cfg.qos.preempts):
        if not NAME.match(name):
            raise fail(f"qos.preempts[{i}]", name, f"must be a plain name: {NAME_RULE}")
    for key in cfg.cluster.env:
        if not ENV_NAME.match(str(key)):
            raise ConfigError(
                f"cluster.env.{key} is invalid: environment variable names are letters, digits and '_', "
                "not starting with a digit"
            )


# cluster.login: [user@]host[:port]. User and host are plain names that
# never start with '-' (ssh would read "-oProxyCommand=..." as an option and
# run it) and hold nothing a remote shell reads (spaces, quotes, ';', '$', '`').
LOGIN = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]{0,63})@)?"
    r"(?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,252})(?::(?P<port>[0-9]{1,5}))?$"
)
LOGIN_FORM = (
    "user@host, user@host:port or host (user and host: letters, digits, '.', '_', '-', "
    "starting with a letter or digit; port 1-65535; an IPv6 address: a Host alias in ~/.ssh/config)"
)


# cluster.python: the login node's Python, one word of the remote shell line.
PYTHON = re.compile(r"^[A-Za-z0-9_./+][A-Za-z0-9_./+-]*$")


@dataclasses.dataclass(frozen=True)
class Login:
    """A checked ``cluster.login``: what ssh is given, never a shell."""

    user: str  # "": ssh's own (its config, else the local user name)
    host: str  # a host name, an address or a Host alias of ~/.ssh/config
    port: int  # 0: ssh's own (its config, else 22)

    def __str__(self) -> str:
        return (f"{self.user}@" if self.user else "") + self.host + (f":{self.port}" if self.port else "")


def parse_login(value: str, field: str = "cluster.login") -> Login:
    """``value`` as a :class:`Login`, or a ConfigError naming ``field``, the
    value and the accepted form; checked before any connection is tried."""
    user_part = re.sub(r"^[A-Za-z][A-Za-z0-9+.-]*://", "", value.rpartition("@")[0])  # a URL's scheme
    if ":" in user_part:
        # user:password@host: never echo it, and never use it (keys only).
        raise ConfigError(
            f"{field}='***' is invalid: it holds a password (user:password@host); meshrun logs in with "
            f"your ssh keys or agent only, never a password: use {LOGIN_FORM}"
        )
    m = LOGIN.match(value)
    if not m:
        raise fail(field, value, f"must be {LOGIN_FORM}")
    port = int(m.group("port") or 0)
    if m.group("port") and not 1 <= port <= 65535:
        raise fail(field, value, f"its port {port} is not a TCP port 1-65535: use {LOGIN_FORM}")
    return Login(m.group("user") or "", m.group("host"), port)


def check_model(cfg: RunConfig) -> None:
    m = cfg.model
    if m.dim % m.n_heads:
        raise fail("model.n_heads", m.n_heads, f"must divide model.dim={m.dim}")
    if m.n_heads % m.n_kv_heads:
        raise fail("model.n_kv_heads", m.n_kv_heads, f"must divide model.n_heads={m.n_heads}")
    if (m.dim // m.n_heads) % 2:
        raise fail("model.n_heads", m.n_heads, "head_dim (dim / n_heads) must be even for RoPE")
    if m.family == "vit" and m.image_size % m.patch_size:
        raise fail("model.patch_size", m.patch_size, f"must divide model.image_size={m.image_size}")


def check_cluster(cfg: RunConfig) -> None:
    c = cfg.cluster
    if c.kind == "slurm":
        if c.gpus_per_node < 1 and cfg.job.kind != "script":  # a team's program may be CPU work
            raise fail(
                "cluster.gpus_per_node", c.gpus_per_node, "must be >= 1 on a Slurm cluster (job=script: 0)"
            )
        if c.node_gpus and c.gpus_per_node > c.node_gpus:
            raise fail(
                "cluster.gpus_per_node", c.gpus_per_node, f"must be <= cluster.node_gpus={c.node_gpus}"
            )
        if c.gpu_mem_gb <= 0:
            raise fail("cluster.gpu_mem_gb", c.gpu_mem_gb, "must be > 0 on a Slurm cluster")
    elif c.nodes != 1:
        raise fail("cluster.nodes", c.nodes, "cluster=local runs on this machine: must be 1")
    if c.login:
        parse_login(c.login)
        if not PYTHON.match(c.python):
            raise fail(
                "cluster.python",
                c.python,
                "must be a program name or a path of letters, digits and '.', '_', '/', '+', '-' "
                "(not starting with '-'), e.g. python3 or /opt/venv/bin/python",
            )
        if c.kind != "slurm":
            raise fail(
                "cluster.login",
                c.login,
                "names a Slurm cluster's login node: use it with a Slurm preset (cluster.kind=slurm), "
                "or leave it empty to run on this machine",
            )
    if c.container_image and not c.pyxis:
        raise fail(
            "cluster.container_image",
            c.container_image,
            "needs Pyxis on the cluster (cluster.pyxis=true); unset it to run without a container",
        )


def check_storage(cfg: RunConfig) -> None:
    s = cfg.storage
    try:
        steps_value(s.save_every_steps)
    except ValueError:
        raise fail(
            "storage.save_every_steps", s.save_every_steps, f"must be an integer >= 1, or {AUTO!r}"
        ) from None
    if s.s3_required and not s.s3_bucket:
        raise fail(
            "storage.s3_bucket",
            s.s3_bucket,
            f"storage={s.name} uploads to S3: set storage.s3_bucket=<bucket> (or choose storage=local)",
        )
    if s.s3_bucket:
        check_bucket(s.s3_bucket)
    if s.s3_prefix.startswith("/") or "//" in s.s3_prefix or "://" in s.s3_prefix:
        raise fail("storage.s3_prefix", s.s3_prefix, "a key prefix like team/llama: no leading '/', no '//'")
    if not re.match(r"^[a-z]{2}(-[a-z]+)+-\d+$|^[a-z0-9-]{1,32}$", s.s3_region):
        raise fail("storage.s3_region", s.s3_region, "an S3 region name like us-east-1")
    if s.s3_endpoint_url and not re.match(r"^https?://[^/\s]+", s.s3_endpoint_url):
        raise fail(
            "storage.s3_endpoint_url", s.s3_endpoint_url, "must be an http:// or https:// URL, or empty"
        )
    check_s3_credentials(cfg)
    if cfg.parallelism.offload_params:
        raise fail(
            "parallelism.offload_params",
            True,
            "meshrun never offloads parameters (it stalls every step on PCIe); "
            "shard more (more GPUs, parallelism.pp) or use activation checkpointing",
        )
    if cfg.train.host_sync_check != "off" and cfg.parallelism.compile:
        # torch 2.13's dynamo traces the watch (a TorchFunctionMode) into each
        # compiled block and fails: "Attempted to call a super() attribute
        # that is not a function or method" (Tensor.unflatten in apply_rope).
        raise fail(
            "train.host_sync_check",
            cfg.train.host_sync_check,
            "cannot watch a torch.compile'd model (dynamo fails to trace the watch): "
            "set train.host_sync_check=off or parallelism.compile=false",
        )


S3_SOURCES = (
    "storage.s3_credentials_file=<path of an AWS credentials file, mode 600> (read-only in the job), "
    "or storage.s3_credentials=role (the nodes' instance / IAM role)"
)


def s3_credentials_source(cfg: RunConfig) -> str:
    """Where the run's S3 credentials come from: ``file``, ``role`` or
    ``env`` ("" when it has no S3 tier). ``auto`` is the file when one is
    named, else the environment on cluster=local (refused on Slurm)."""
    s = cfg.storage
    if not s.s3_bucket:
        return ""
    if s.s3_credentials != "auto":
        return s.s3_credentials
    return "file" if s.s3_credentials_file else "env" if cfg.cluster.kind == "local" else ""


def s3_credentials_file(cfg: RunConfig) -> str:
    """The credentials file the tasks read (AWS_SHARED_CREDENTIALS_FILE), or ""."""
    return cfg.storage.s3_credentials_file if s3_credentials_source(cfg) == "file" else ""


def check_s3_credentials(cfg: RunConfig) -> None:
    """A credentials source for S3 that keeps keys out of Slurm: a file the
    job reads (not world-readable) or a role; the environment only locally."""
    s = cfg.storage
    if s.s3_credentials_file:
        check_credentials_file(s.s3_credentials_file)
    if s.s3_credentials == "file" and not s.s3_credentials_file:
        raise fail("storage.s3_credentials_file", "", f"storage.s3_credentials=file needs it: {S3_SOURCES}")
    if s.s3_credentials in ("role", "env") and s.s3_credentials_file:
        raise fail(
            "storage.s3_credentials_file",
            s.s3_credentials_file,
            f"unused with storage.s3_credentials={s.s3_credentials}: unset one of them",
        )
    source = s3_credentials_source(cfg)
    if s.s3_bucket and cfg.cluster.kind == "slurm" and source in ("", "env"):
        raise fail(
            "storage.s3_credentials",
            s.s3_credentials,
            f"storage.s3_bucket={s.s3_bucket} needs S3 credentials that do not go through Slurm "
            f"(sbatch stores the environment in the controller and accounting): {S3_SOURCES}; "
            "the environment (env) is for cluster=local only",
        )


def check_credentials_file(path: str) -> None:
    """Absolute, a readable file, not readable by every user."""
    field = "storage.s3_credentials_file"
    if not os.path.isabs(path):
        raise fail(
            field, path, f"an absolute path (the jobs read it at that path), e.g. {os.path.abspath(path)}"
        )
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise fail(field, path, "no readable file there: an AWS shared credentials file ([profile] + keys)")
    if os.stat(path).st_mode & 0o004:
        raise fail(field, path, f"every user can read it: chmod 600 {path}")


def check_bucket(bucket: str) -> None:
    """S3's bucket naming rules, with a hint for a URL or a path."""
    if "://" in bucket or "/" in bucket:
        rest = bucket.split("://", 1)[-1].strip("/")
        name, _, prefix = rest.partition("/")
        hint = f"storage.s3_bucket={name}" + (f" storage.s3_prefix={prefix}" if prefix else "")
        raise fail("storage.s3_bucket", bucket, f"a bucket name, not a URL or path: use {hint}")
    why = ""
    if not BUCKET.match(bucket):
        why = BUCKET_RULE
    elif ".." in bucket:
        why = "no two adjacent '.'"
    elif re.match(r"^\d+\.\d+\.\d+\.\d+$", bucket):
        why = "not formatted like an IP address"
    elif bucket.startswith(BUCKET_BAD_PREFIXES) or bucket.endswith(BUCKET_BAD_SUFFIXES):
        why = f"S3 reserves the prefixes {', '.join(BUCKET_BAD_PREFIXES)} and suffixes {', '.join(BUCKET_BAD_SUFFIXES)}"
    if why:
        suggestion = re.sub(r"[^a-z0-9.-]+", "-", bucket.lower()).strip("-.")
        raise fail(
            "storage.s3_bucket", bucket, why + (f" (e.g. {suggestion})" if BUCKET.match(suggestion) else "")
        )


def check_straggler(cfg: RunConfig) -> None:
    lc = cfg.launcher
    if lc.straggler_min_slow > lc.straggler_window:
        raise fail(
            "launcher.straggler_min_slow",
            lc.straggler_min_slow,
            f"must be 1-{lc.straggler_window} (at most launcher.straggler_window={lc.straggler_window} probes)",
        )


def check_code_include(cfg: RunConfig) -> None:
    """Each launcher.code_include is a path inside the tree it names (that it
    exists is checked where the trees are listed: launcher/run/codesnap.py)."""
    for i, path in enumerate(cfg.launcher.code_include):
        if not isinstance(path, str) or not path.strip() or ".." in path.split("/"):
            raise fail(
                f"launcher.code_include[{i}]",
                path,
                "name a file or folder inside job.workdir or the meshrun code dir (no '..'), "
                "e.g. launcher.code_include=[.env.public]",
            )


def check_data(cfg: RunConfig) -> None:
    d = cfg.data
    if d.kind != "synthetic" and not d.path:
        raise fail("data.path", d.path, f"data={d.name} reads files: set data.path=<dir>")
    if d.kind == "images" and cfg.model.family != "vit":
        raise fail("model.family", cfg.model.family, "data=images needs an image model (family=vit)")
    if d.kind != "images" and cfg.model.family == "vit":
        raise fail("data.kind", d.kind, "a vit model needs data=images")


def check_tracking(cfg: RunConfig) -> None:
    """W&B is optional: asked for, it must be importable (found without importing it)."""
    if cfg.train.wandb != "off" and importlib.util.find_spec("wandb") is None:
        raise fail(
            "train.wandb",
            cfg.train.wandb,
            "Weights & Biases is not installed for this Python: pip install wandb, or set train.wandb=off",
        )


def validate(cfg: RunConfig) -> None:
    """Run all field-level checks; layout checks happen in the planner."""
    check_credentials(cfg)
    check_strings(cfg)
    check_choices(cfg)
    check_ranges(cfg)
    check_model(cfg)
    check_cluster(cfg)
    check_storage(cfg)
    check_data(cfg)
    check_straggler(cfg)
    check_code_include(cfg)
    check_tracking(cfg)
