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
import site
import subprocess
import sys
import tempfile
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


@dataclass
class LaptopUser:
    """Another Unix user with its own key, Python and copy of the project:
    the laptop. ``env`` is its whole environment (no Slurm command on PATH,
    no SLURM_CONF); ``python`` a Python it can run (Debian's, not this
    interpreter: that one lives under /root, which another user cannot enter)."""

    name: str
    home: Path
    project: Path  # its own copy of this repository (what it snapshots and ships)
    python: str
    env: dict[str, str]

    def run(
        self, *argv: str, cwd: Path | None = None, timeout: float = 240
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` as this user, in ``cwd`` (default: its home), with only its environment."""
        env = [f"{k}={v}" for k, v in self.env.items()]
        return subprocess.run(
            ["runuser", "-u", self.name, "--", "env", "-i", *env, *argv],
            capture_output=True, text=True, timeout=timeout, cwd=cwd or self.home,
        )  # fmt: skip

    def popen(self, *argv: str, cwd: Path | None = None) -> subprocess.Popen[str]:
        env = [f"{k}={v}" for k, v in self.env.items()]
        return subprocess.Popen(
            ["runuser", "-u", self.name, "--", "env", "-i", *env, *argv],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd or self.home,
        )  # fmt: skip


LAPTOP_PYTHON = Path("/usr/bin/python3")


def laptop_missing() -> str | None:
    """Why no laptop user can be made here, or None."""
    if os.geteuid() != 0:
        return "the laptop is another Unix user: run as root (CI does)"
    if not LAPTOP_PYTHON.exists():
        return f"no {LAPTOP_PYTHON} for the laptop user: apt-get install python3"
    probe = subprocess.run([str(LAPTOP_PYTHON), "-c", "import sys; print(sys.version_info[:2])"],
                           capture_output=True, text=True)  # fmt: skip
    if probe.stdout.strip() != str(tuple(sys.version_info[:2])):
        return f"{LAPTOP_PYTHON} is Python {probe.stdout.strip()}, not this one's (the laptop borrows its packages)"
    return missing() or (None if shutil.which("runuser") else "no runuser (util-linux)")


def _copy_tree(src: Path, dst: Path) -> None:
    """Hard links where the disk allows (fast; the files stay read-only to the user), else copies."""
    if subprocess.run(["cp", "-al", str(src), str(dst)], capture_output=True).returncode != 0:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, symlinks=True)


@contextlib.contextmanager
def laptop_user(server: SshServer, repo: Path, name: str = "msshlap") -> Iterator[LaptopUser]:
    """A Unix user ``name`` made for the duration: its home under /tmp (0700,
    its own), its own ed25519 key (authorized for the server's login user,
    which is this one), an ssh config and known_hosts of its own, its own copy
    of ``repo``'s files (tracked and untracked, never ignored ones) and of the
    packages meshrun imports without torch. The user is removed on exit."""
    subprocess.run(["userdel", "-r", name], capture_output=True)
    home = Path(tempfile.mkdtemp(prefix="mlap", dir="/tmp"))  # short: ssh's control socket lives here
    subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/sh", name], check=True)
    try:
        # Its packages: the top-level folders of what `import launcher.api` and a
        # composition load from this interpreter's site-packages.
        probe = (
            "import sys, site, launcher.api, launcher.__main__, launcher.cli, launcher.pipeline\n"
            "from launcher.config.compose import compose; compose([])\n"
            "sp = site.getsitepackages()[0]\n"
            "print('\\n'.join(sorted({f[len(sp) + 1:].split('/')[0] for m in list(sys.modules.values())"
            " if (f := getattr(m, '__file__', None) or '').startswith(sp + '/')})))"
        )
        tops = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                              cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}).stdout.split()  # fmt: skip
        site_dir = Path(site.getsitepackages()[0])
        lib = home / "site-packages"
        lib.mkdir()
        for top in tops:
            if top.startswith("_distutils_hack"):
                continue
            for part in (top, f"{top}.libs"):  # .libs: a wheel's bundled shared libraries (numpy's)
                src = site_dir / part
                if src.is_dir():
                    _copy_tree(src, lib / part)
                elif src.exists():
                    shutil.copy2(src, lib / part)
        project = home / "project"
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo,
                                capture_output=True, check=True).stdout.decode().split("\0")  # fmt: skip
        for rel in filter(None, listed):
            src, dst = repo / rel, project / rel
            if src.is_file() and not src.is_symlink():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir()
        key = ssh_dir / "id_ed25519"
        pub = _keygen(key)
        with open(server.client_config.parent / "authorized_keys", "a") as f:
            f.write(pub + "\n")
        known = ssh_dir / "known_hosts"
        shutil.copy(server.known_hosts, known)
        config = ssh_dir / "config"
        config.write_text(
            f"Host *\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {known}\n  GlobalKnownHostsFile /dev/null\n"
        )
        bindir = home / "bin"
        bindir.mkdir()
        # Its own ssh (with its own config), git and a shell: no Slurm command.
        (bindir / "ssh").write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {config} "$@"\n')
        (bindir / "ssh").chmod(0o755)
        for tool in ("sh", "env", "git"):
            os.symlink(shutil.which(tool) or f"/bin/{tool}", bindir / tool)
        # Its own files; the packages stay root's (hard links share their owner with the originals).
        subprocess.run(["chown", f"{name}:", str(home)], check=True)
        subprocess.run(["chown", "-R", f"{name}:", str(project), str(ssh_dir), str(bindir)], check=True)
        os.chmod(home, 0o700)
        env = {
            "HOME": str(home),
            "USER": name,
            "PATH": str(bindir),
            "PYTHONPATH": f"{project}:{lib}",
            "XDG_RUNTIME_DIR": str(home),
            "XDG_CACHE_HOME": str(home / ".cache"),
        }
        yield LaptopUser(name, home, project, str(LAPTOP_PYTHON), env)
    finally:
        subprocess.run(["pkill", "-u", name], capture_output=True)  # its ssh control master
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
