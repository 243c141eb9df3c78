"""A real OpenSSH server (Debian's openssh-server) on 127.0.0.1 for the SSH
transport's tests (launcher/slurm/remote.py), and the "laptop" side's ssh.

``ssh_server(tmp, session_env)`` starts ``/usr/sbin/sshd -D`` on a free
port with its own config and host key: key logins only, for this Unix user,
with one generated client key. The client side is the user's own ``ssh``
as meshrun finds it on PATH: a wrapper first on PATH that adds ``-F`` the
client config (that key, a known_hosts that holds the server's host key;
host key checking left on). ``session_env`` is set in every session
(sshd's SetEnv): the tests' stand-in for a login node's environment.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness import free_port

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")  # Debian's sshd refuses to start without it


@dataclass
class SshServer:
    port: int
    user: str
    bindir: Path  # put first on PATH: its ``ssh`` is the laptop's ssh
    client_config: Path
    known_hosts: Path
    log: Path

    @property
    def login(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"


def missing() -> str | None:
    """Why no server can start here, or None."""
    if not SSHD.exists():
        return f"no {SSHD}: apt-get install openssh-server (scripts/setup.sh --test-cluster installs it)"
    if shutil.which("ssh-keygen") is None or shutil.which("ssh") is None:
        return "no OpenSSH client (ssh, ssh-keygen): apt-get install openssh-client"
    return None


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 10) -> None:
    import socket

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"sshd did not listen on 127.0.0.1:{port} in {timeout} s: {log.read_text()[-2000:]}")


@contextlib.contextmanager
def ssh_server(tmp: Path, session_env: dict[str, str] | None = None) -> Iterator[SshServer]:
    """The server and the client's wrapper; the server is stopped on exit."""
    tmp.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o700)  # sshd's StrictModes is off, but keys stay private anyway
    host_pub = _keygen(tmp / "host_ed25519")
    client_pub = _keygen(tmp / "client_ed25519")
    (tmp / "authorized_keys").write_text(client_pub + "\n")
    port, user = free_port(), getpass.getuser()
    setenv = " ".join(f'"{k}={v}"' for k, v in (session_env or {}).items())
    (tmp / "sshd_config").write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {tmp / 'host_ed25519'}",
                f"PidFile {tmp / 'sshd.pid'}",
                f"AuthorizedKeysFile {tmp / 'authorized_keys'}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                f"AllowUsers {user}",
                "LogLevel VERBOSE",
                *([f"SetEnv {setenv}"] if setenv else []),
            ]
        )
        + "\n"
    )
    known_hosts = tmp / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub}\n")
    client_config = tmp / "ssh_config"
    client_config.write_text(
        f"Host *\n  IdentityFile {tmp / 'client_ed25519'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
    )
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    wrapper = bindir / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {client_config} "$@"\n')
    wrapper.chmod(0o755)
    if os.geteuid() == 0:
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    log = tmp / "sshd.log"
    proc = subprocess.Popen(
        [str(SSHD), "-D", "-e", "-f", str(tmp / "sshd_config")],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_port(port, proc, log)
        yield SshServer(port, user, bindir, client_config, known_hosts, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
