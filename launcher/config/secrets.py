"""Find credentials in a composed run config, so validation can refuse them
before anything is written.

meshrun writes its config into the run dir (``config.yaml``, the run spec),
the sbatch script and Hydra's files, all readable by whoever can read the run
dir. A credential in any of them leaks, so none is accepted. Nor does a
credential reach Slurm: sbatch stores the submitting environment in the
controller's state (and in accounting with ``AccountingStoreFlags=job_env``),
so :func:`secret_env_names` picks the variables every submission and every
task environment leaves out. Jobs read S3 credentials from a file
(``storage.s3_credentials_file``) or an instance role (docs/security.md).
Findings never carry the secret itself, only a masked form that still says
where it is.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

# scheme://userinfo@host: "user:password@" and "token@" both authenticate.
# The second form catches "user:pass@" typed with a raw "/" in the password
# (a parser would stop the host at the "/", but the secret is still there).
URL_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s]+|[^/?#@\s:]*:[^@\s]*)@"
)

# Well-known credential shapes, searched anywhere inside a value.
VALUE_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("an AWS access key id", re.compile(r"(?<![A-Z0-9])(AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Z0-9])")),
    ("a GitHub token", re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("a Slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}")),
    ("an API secret key", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")),
    ("a JSON web token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
]
# An AWS secret access key: exactly 40 base64 characters, mixed case and
# digits (a 40-character hex digest is lower case only). Only checked for
# whole environment values: a path can contain such a run of characters.
AWS_SECRET_VALUE = re.compile(r"^[A-Za-z0-9/+]{40}$")

# Environment names that hold credentials, matched per "_"-separated word so
# that e.g. TOKENIZERS_PARALLELISM is not taken for a token.
SECRET_WORDS = {"SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "TOKEN", "CREDENTIAL", "CREDENTIALS", "APIKEY"}
SECRET_WORD_SUFFIXES = ("PASSWORD", "PASSWD", "SECRET", "TOKEN", "APIKEY")
SECRET_WORD_PAIRS = {
    ("API", "KEY"),
    ("ACCESS", "KEY"),
    ("PRIVATE", "KEY"),
    ("SESSION", "KEY"),
    ("SECRET", "KEY"),
}
# Variables that name a credentials *file* (a path), not a credential.
PATH_SUFFIXES = ("_FILE", "_PATH", "_DIR")

WHERE_INSTEAD = (
    "meshrun writes its config to the run dir and the sbatch script, so credentials never go in it: "
    "Slurm jobs read S3 keys from a credentials file (storage.s3_credentials_file=<path>, mode 600, "
    "optionally with AWS_PROFILE=<name>) or an instance role (storage.s3_credentials=role); "
    "a local run (cluster=local) may also take them from the environment of the shell that runs meshrun"
)
# AWS variables that hold a credential whatever their name's words say.
AWS_SECRET_NAMES = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
}


class Finding(NamedTuple):
    field: str  # e.g. "cluster.env.AWS_SECRET_ACCESS_KEY"
    masked: str  # the value with the secret part replaced by ***
    what: str  # why it is taken for a credential


def mask(value: str) -> str:
    """A value with every credential-looking part replaced by ``***``."""
    out = URL_USERINFO.sub(lambda m: f"{m['scheme']}***@", value)
    for _, pattern in VALUE_PATTERNS:
        out = pattern.sub("***", out)
    return "***" if AWS_SECRET_VALUE.match(out) else out


def secret_env_name(key: str) -> bool:
    """Does an environment variable name say it holds a credential?"""
    upper = key.upper()
    if upper.endswith(PATH_SUFFIXES):
        return False
    words = [w for w in upper.split("_") if w]
    if any(w in SECRET_WORDS or w.endswith(SECRET_WORD_SUFFIXES) for w in words):
        return True
    return any(pair in SECRET_WORD_PAIRS for pair in zip(words, words[1:], strict=False))


def secret_env_names(env: Mapping[str, str]) -> list[str]:
    """The variables of ``env`` that hold a credential: AWS keys, names that
    say secret / token / password / key, values shaped like a credential (a
    token, ``user:pass@`` in a URL). What sbatch, srun and the tasks are not
    given (launcher/slurm/submit.py, the batch script, the supervisor)."""
    return sorted(
        k
        for k, v in env.items()
        if v
        and (
            k.upper() in AWS_SECRET_NAMES
            or secret_env_name(k)
            or _value_finding(k, v, env_value=k.upper().startswith("AWS_"))
        )
    )


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less :func:`secret_env_names`."""
    drop = set(secret_env_names(env))
    return {k: v for k, v in env.items() if k not in drop}


def _value_finding(field: str, value: str, *, env_value: bool) -> Finding | None:
    m = URL_USERINFO.search(value)
    if m:
        return Finding(field, mask(value), "a URL with a user name or password (user:pass@host)")
    for what, pattern in VALUE_PATTERNS:
        if pattern.search(value):
            return Finding(field, mask(value), f"the value looks like {what}")
    if env_value and AWS_SECRET_VALUE.match(value) and _mixed(value):
        return Finding(field, "***", "the value looks like an AWS secret access key")
    return None


def _mixed(value: str) -> bool:
    return (
        any(c.isupper() for c in value)
        and any(c.islower() for c in value)
        and any(c.isdigit() for c in value)
    )


def strings(node: Any, prefix: str = "") -> Iterator[tuple[str, str, bool]]:
    """(field, string, is an env value) for every string reachable from node."""
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            yield from strings(getattr(node, f.name), f"{prefix}.{f.name}" if prefix else f.name)
    elif isinstance(node, dict):
        for key, value in node.items():
            field = f"{prefix}.{key}"
            if isinstance(value, str) and prefix.endswith(".env"):
                yield field, value, True
            else:
                yield from strings(value, field)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from strings(value, f"{prefix}[{i}]")
    elif isinstance(node, str):
        yield prefix, node, False


def find_credentials(cfg: Any) -> list[Finding]:
    """Every credential in ``cfg`` (a RunConfig): environment variables whose
    name says credential (non-empty value), credential-shaped values in any
    string field, and user info in any URL."""
    found: list[Finding] = []
    for key, value in cfg.cluster.env.items():
        if value and secret_env_name(str(key)):
            found.append(
                Finding(
                    f"cluster.env.{key}", "***", f"{key} names a credential (secret, token, password or key)"
                )
            )
    seen = {f.field for f in found}
    for field, value, env_value in strings(cfg):
        if field in seen:
            continue
        hit = _value_finding(field, value, env_value=env_value)
        if hit:
            found.append(hit)
    return found


def override_findings(overrides: list[str]) -> list[Finding]:
    """Credentials in Hydra override strings (``[+|++]key=value``), found
    before Hydra parses them: Hydra's own errors repeat the value (e.g.
    "To append to your config use +cluster.env.HF_TOKEN=<value>")."""
    found: list[Finding] = []
    for arg in overrides:
        key, eq, value = arg.partition("=")
        if not eq or key.startswith("-"):
            continue
        key = key.lstrip("+~")
        raw = value.strip("'\"")
        name = key.rsplit(".", 1)[-1]
        if key.startswith("cluster.env.") and raw and secret_env_name(name):
            found.append(Finding(key, "***", f"{name} names a credential (secret, token, password or key)"))
            continue
        hit = _value_finding(key, raw, env_value=key.startswith("cluster.env."))
        if hit:
            found.append(hit)
    return found


def refusal(finding: Finding) -> str:
    """The one-line refusal of a credential, with where it goes instead."""
    return f"{finding.field}={finding.masked!r} is refused: {finding.what}. {WHERE_INSTEAD}"
