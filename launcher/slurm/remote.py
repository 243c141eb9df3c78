"""The SSH transport: Slurm's commands run on a cluster's login node
(``cluster.login``) through the user's own ``ssh``, from a machine without Slurm.

Plain OpenSSH, as the user has it: their ``ssh`` on PATH, their
``~/.ssh/config`` (keys, agent, ProxyJump), their known_hosts. meshrun adds
only what makes it safe and quick to call many times:

- ``BatchMode=yes``: never a password or passphrase prompt (a run must not
  hang on one; keys or the agent only) and an unknown host key is refused,
  never accepted; host key checking stays whatever the user's config says.
- One multiplexed connection (``ControlMaster=auto``, a socket in a private
  directory of this user's, ``ControlPersist=60``): a command after the
  first costs a round trip, not a handshake.
- The argv is a list (no local shell); the remote line that ssh hands the
  login node's shell is built with ``shlex.quote`` from a checked
  :class:`~launcher.config.validate.Login` and the command's arguments.

A failure is one line naming the host and the fix (:class:`RemoteError`):
unreachable, key refused, host key unknown, no Slurm on the login node.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from launcher.config.validate import Login

# What may run through :func:`slurm_run` (the read side, cancel, submission).
SLURM_COMMANDS = frozenset({"sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "sacctmgr", "srun"})
TIMEOUT_S = 20.0
CONNECT_TIMEOUT_S = 10  # a host that does not answer fails in this, not in the command's timeout
CONTROL_PERSIST_S = 60  # the shared connection outlives the last command by this
SSH_FAILED = 255  # ssh's own exit code for its failures
NOT_FOUND = 127  # a POSIX shell's for a command it cannot find
# ControlPath's value is one ssh option word: a path of these characters only.
PLAIN_PATH = re.compile(r"^[A-Za-z0-9/._-]+$")


class RemoteError(RuntimeError):
    """The login node could not be reached or has no Slurm: one line, the host and the fix."""


def control_dir() -> Path:
    """This user's private directory for ssh's shared connection sockets
    (under $XDG_RUNTIME_DIR, else the temp dir): made 0700, refused when it
    is someone else's or others may enter it (a socket there is a logged-in
    connection)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = Path(base) / f"meshrun-ssh-{os.getuid()}"
    if not PLAIN_PATH.match(str(path)):
        path = Path("/tmp") / path.name  # ssh reads ControlPath as one word
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RemoteError(
            f"{path} (ssh's shared connections) is not a private directory of yours (mode 0700, "
            f"owned by uid {os.getuid()}): remove it and run again"
        )
    return path


def ssh_argv(login: Login, remote_line: str, control: Path) -> list[str]:
    """The exact argv that runs ``remote_line`` on ``login``'s host. The
    host comes after ``--`` so nothing in it is ever read as an option."""
    argv = [
        "ssh",
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o", "ControlMaster=auto",
        "-o", f"ControlPath={control}/%C",
        "-o", f"ControlPersist={CONTROL_PERSIST_S}",
    ]  # fmt: skip
    if login.port:
        argv += ["-p", str(login.port)]
    if login.user:
        argv += ["-l", login.user]
    return [*argv, "--", login.host, remote_line]


def remote_line(args: list[str], env: dict[str, str] | None = None) -> str:
    """The line the login node's shell runs: each word quoted; ``env``
    (never a secret: it is seen in the remote process list) through ``env``."""
    words = [*(["env", *(f"{k}={v}" for k, v in env.items())] if env else []), *args]
    return shlex.join(words)


def slurm_line(args: list[str], env: dict[str, str] | None = None) -> str:
    """:func:`remote_line` of a Slurm command, behind a check that the login
    node has it (so a missing one says "no Slurm", not a shell's error)."""
    if not args or args[0] not in SLURM_COMMANDS:
        raise ValueError(f"not a Slurm command: {args[:1]} (one of {', '.join(sorted(SLURM_COMMANDS))})")
    guard = f"command -v {shlex.quote(args[0])} >/dev/null 2>&1 || exit {NOT_FOUND}"
    return f"{guard}; exec {remote_line(args, env)}"


def how_to_try(login: Login) -> str:
    """The plain ssh command a user runs to see the problem for themselves."""
    target = (f"{login.user}@" if login.user else "") + login.host
    return shlex.join(["ssh", *(["-p", str(login.port)] if login.port else []), target])


def ssh_failure(login: Login, stderr: str) -> str | None:
    """One line on ssh's own failure (exit 255) and its fix; None when
    ``stderr`` is not ssh's (the remote program exited 255 itself)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = next((ln for ln in reversed(lines) if ln.startswith(("ssh:", "kex_", "Connection "))), "")
    text = " ".join(lines)
    where, again = f"{login.host}" + (f" port {login.port}" if login.port else ""), how_to_try(login)
    if "Host key verification failed" in text or "HOST IDENTIFICATION HAS CHANGED" in text:
        return (
            f"{where}: its SSH host key is not in your known_hosts, or has changed: connect once by hand "
            f"({again}), check the fingerprint with the cluster's admins and accept it; meshrun never "
            "turns host key checking off"
        )
    if "Permission denied" in text:
        who = login.user or "your user"
        return (
            f"{where} refused the SSH login of {who} ({said or 'Permission denied'}): add your public key "
            f"there (ssh-copy-id) or load it into your agent (ssh-add), then check `{again} true`; "
            "meshrun logs in with keys only, never a password"
        )
    if said or not lines:
        return (
            f"cannot reach {where} over SSH ({said or 'ssh failed with no message'}): check cluster.login="
            f"{login} and that `{again} true` works from here"
        )
    return None


def remote_run(
    login: Login,
    args: list[str],
    *,
    line: str | None = None,
    timeout: float = TIMEOUT_S,
    control: Path | None = None,
    stdin: bytes | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``args`` (or a prepared ``line``) on ``login``'s host, ``stdin``
    its input (none: closed): its exit code and output as the remote program
    gave them; ssh's own failures and a timeout raise :class:`RemoteError`."""
    if shutil.which("ssh") is None:
        raise RemoteError(
            f"no ssh here to reach cluster.login={login}: install OpenSSH's client "
            "(Debian: apt-get install openssh-client)"
        )
    argv = ssh_argv(login, line if line is not None else remote_line(args), control or control_dir())
    try:
        # No input: stdin closed, ssh must not read the caller's terminal or pipe.
        done = subprocess.run(
            argv,
            capture_output=True,
            timeout=timeout,
            **({"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}),
        )
        text = [b.decode(errors="replace") for b in (done.stdout, done.stderr)]
        out = subprocess.CompletedProcess(argv, done.returncode, *text)
    except subprocess.TimeoutExpired as e:
        raise RemoteError(
            f"{login.host} did not answer `{shlex.join(args)}` over SSH within {timeout:.0f} s: "
            f"check that `{how_to_try(login)} true` answers from here"
        ) from e
    if out.returncode == SSH_FAILED:
        problem = ssh_failure(login, out.stderr)
        if problem:
            raise RemoteError(problem)
    return out


def slurm_run(
    login: Login,
    args: list[str],
    *,
    timeout: float = TIMEOUT_S,
    env: dict[str, str] | None = None,
    control: Path | None = None,
    stdin: bytes | None = None,
) -> subprocess.CompletedProcess[str]:
    """Slurm command ``args`` on the login node (``stdin``: its input, e.g.
    the script ``sbatch`` reads when given no file); ``RemoteError`` when the
    node cannot be reached or has no such command."""
    out = remote_run(login, args, line=slurm_line(args, env), timeout=timeout, control=control, stdin=stdin)
    if out.returncode == NOT_FOUND and not out.stdout:
        raise RemoteError(no_slurm(login, args[0]))
    return out


def no_slurm(login: Login, command: str) -> str:
    return (
        f"no Slurm on the login node {login.host}: `command -v {command}` finds nothing there; set "
        "cluster.login to a Slurm login node, or put Slurm's bin directory on PATH for non-interactive "
        f"shells there (~/.bashrc), then check `{how_to_try(login)} command -v {command}`"
    )


def check_login_node(login: Login, *, timeout: float = TIMEOUT_S, control: Path | None = None) -> None:
    """The login node answers over SSH and has Slurm (``command -v sbatch``);
    :class:`RemoteError` says which of the two is wrong and how to fix it."""
    out = remote_run(
        login, ["command", "-v", "sbatch"], line="command -v sbatch", timeout=timeout, control=control
    )
    if out.returncode:
        raise RemoteError(no_slurm(login, "sbatch"))


def remote_user(login: Login, *, control: Path | None = None) -> str:
    """The user name Slurm knows on the login node: ``login``'s, else what
    ``id -un`` says there (the user ssh's config logs in as)."""
    if login.user:
        return login.user
    out = remote_run(login, ["id", "-un"], control=control)
    name = out.stdout.strip()
    if out.returncode or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", name):
        raise RemoteError(f"{login.host}: `id -un` did not say a user name ({out.stderr.strip()[:200]})")
    return name


def close_connection(login: Login, *, control: Path | None = None) -> None:
    """End the shared connection to ``login`` now (``ssh -O exit``), instead
    of ControlPersist's idle time; nothing when there is none."""
    argv = ssh_argv(login, "", control or control_dir())[:-1]
    subprocess.run(
        [argv[0], "-O", "exit", *argv[1:]], capture_output=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
    )
