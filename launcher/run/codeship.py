"""A code store entry (launcher/run/codestore.py) shipped to the cluster's
store over SSH (``cluster.login``), content-addressed: an entry the login
node already holds intact is not sent again; a changed tree sends only its
changed files (the rest copied there from the last entry of its kind this
machine shipped to that store, named in the local store's .shipped.json);
a missing or damaged one with no such base is sent whole, as one tar stream
over the shared connection. A delta that does not check out there (its base
changed) is sent again whole.

The remote layout is the local one: ``<store>/<remote user>/<digest>/
{snapshot.json, .lock, <kind>/}``, made private (umask 077), files
read-only, written into a temporary folder and renamed into place. It is
checked on the login node with ``sha256sum -c`` against the manifest the
laptop sent, plus a count of its files and no links: a damaged entry is
replaced, never run. Nothing of the user's but the entry's files goes over
(no environment, no credentials).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shlex
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher.config.schema import RunConfig
from launcher.config.validate import ConfigError, Login
from launcher.run import codestore
from launcher.run.codesnap import plan_code, store_root, store_tree
from launcher.run.codewalk import SNAPSHOT_FILE, STORE_DIR
from launcher.slurm.remote import RemoteError, remote_run

SHIP_TIMEOUT_S = 300.0
# The remote store: an absolute path of plain characters (it is spliced into
# the remote shell line quoted, and a path a user cannot misread).
STORE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")


@dataclass(frozen=True)
class Shipped:
    entry: str  # the entry's folder on the login node
    files: int  # files sent: 0 when the login node had the entry intact
    bytes_sent: int  # bytes of the tar stream sent (0 likewise)


def check_store_path(path: str, field: str) -> str:
    """``path`` as the remote store's root, or a ConfigError naming ``field``."""
    if not STORE_PATH.match(path) or ".." in path.split("/") or path.rstrip("/") == "":
        raise ConfigError(
            f"{field}={path!r} is invalid: an absolute path on the cluster of letters, digits and "
            "'.', '_', '/', '+', '-' (no '..'), e.g. /shared/alice/runs/.code"
        )
    return path.rstrip("/")


def _manifest(entry: Path) -> tuple[str, str, dict[str, str]]:
    """(digest, kind, files: path -> sha256) of a local entry's snapshot.json."""
    meta = json.loads((entry / SNAPSHOT_FILE).read_text())
    files = meta["files"]
    for rel in files:
        if any(c in rel for c in "\n\r\\") or rel.startswith("/") or ".." in rel.split("/"):
            raise ConfigError(
                f"{entry}: file {rel!r} cannot be checked on the login node (sha256sum): rename it"
            )
    digest, kind = meta["digest"], meta["kind"]
    # Both reach the remote shell line: a sha256 and a known kind only.
    if not re.fullmatch(r"[0-9a-f]{64}", str(digest)) or kind not in ("meshrun", "project"):
        raise ConfigError(
            f"{entry / SNAPSHOT_FILE}: not a code store manifest (digest {digest!r}, kind {kind!r})"
        )
    return digest, kind, files


def _check_line(entry: str, kind: str, n_files: int) -> str:
    """The remote shell line that exits 0 only when the entry (``entry``: a
    shell word, quoted by the caller) is there intact: snapshot.json, the
    files of the manifest on its stdin, nothing else, no links."""
    k = shlex.quote(kind)
    return (
        f"[ -f {entry}/{SNAPSHOT_FILE} ] && cd {entry}/{k} && sha256sum -c --status - && "
        f'[ "$(find . -type f | wc -l)" -eq {n_files} ] && [ -z "$(find . ! -type f ! -type d)" ]'
    )


# The last entry of each kind shipped to each login node's store, in the
# user's own local store: the base a changed tree is sent against.
SHIPPED_FILE = ".shipped.json"
REUSE_FILE = ".reuse"  # in a delta's tar: the base's files to take, NUL-separated


def _shipped_key(login: Login, store: str, role: str) -> str:
    return f"{login}|{store}|{role}"


def _base(entry: Path, key: str, files: dict[str, str]) -> tuple[str, list[str]]:
    """(the base entry's digest, the files it holds unchanged: same path, same
    sha256) from the last shipment under ``key``; ("", []) when there is none
    here to compare with."""
    try:
        digest = json.loads((entry.parent / SHIPPED_FILE).read_text()).get(key, "")
        base = json.loads((entry.parent / digest / SNAPSHOT_FILE).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return "", []
    if not re.fullmatch(r"[0-9a-f]{64}", str(digest)) or digest == entry.name:
        return "", []
    return digest, sorted(rel for rel, sha in files.items() if base.get(rel) == sha)


def _remember(entry: Path, key: str) -> None:
    """``entry`` as the last shipment under ``key`` (a lost race only costs a bigger send later)."""
    path = entry.parent / SHIPPED_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = {}
    doc = {**(doc if isinstance(doc, dict) else {}), key: entry.name}
    tmp = path.with_name(f"{SHIPPED_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(doc))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _tar(entry: Path, kind: str = "", reuse: Sequence[str] = ()) -> bytes:
    """The entry as a tar stream: its own modes, no owner names; the files of
    ``kind`` named in ``reuse`` left out and listed in REUSE_FILE instead."""
    skip = {f"{kind}/{rel}" for rel in reuse}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if reuse:
            listed = "".join(f"{rel}\0" for rel in reuse).encode()
            info = tarfile.TarInfo(REUSE_FILE)
            info.size, info.mode = len(listed), 0o400
            tar.addfile(info, io.BytesIO(listed))
        for path in sorted(entry.rglob("*")):
            if str(path.relative_to(entry)) in skip:
                continue
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(entry)))
            if not (info.isfile() or info.isdir()):
                raise ConfigError(
                    f"{path} is neither a file nor a folder: the code store entry is not shipped"
                )
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def ship_entry(
    login: Login, entry: Path, store: str, *, field: str = "the remote code store", role: str = ""
) -> Shipped:
    """Make ``<store>/<remote user>/<digest>`` on the login node hold the
    local ``entry``: checked there first (nothing sent when intact), else
    sent (its changed files, or whole) and checked again. :class:`RemoteError`
    when that fails. This process's hold on the local entry ends here: the
    run uses the cluster's copy, and ``meshrun snapshot --gc --shipped`` may
    clean this one (a long-lived process, a notebook, would hold it forever).
    ``role`` (default: the entry's kind) names its line of shipments, the
    base of the next one: a project's is never the user's presets'."""
    try:
        return _ship_entry(login, entry, store, field, role)
    finally:
        codestore.release(entry)


def _ship_entry(login: Login, entry: Path, store: str, field: str, role: str) -> Shipped:
    store = check_store_path(store, field)
    digest, kind, files = _manifest(entry)
    sums = "".join(f"{sha}  {rel}\n" for rel, sha in sorted(files.items())).encode()
    # The login user's own folder, as in the local store; the line prints the entry's path first.
    where = f'E={shlex.quote(store)}/"$(id -un)"/{digest}; echo "$E"; '
    probe = where + _check_line('"$E"', kind, len(files))
    out = remote_run(login, ["sh"], line=probe, stdin=sums, timeout=SHIP_TIMEOUT_S)
    remote_entry = out.stdout.splitlines()[0] if out.stdout.strip() else ""
    if not re.fullmatch(re.escape(store) + r"/[^/\s]+/" + digest, remote_entry):  # `id -un` said a name
        raise RemoteError(
            f"{login.host}: no answer about the code store {store} ({out.stderr.strip()[:200]})"
        )
    key = _shipped_key(login, store, role or kind)
    if out.returncode == 0:
        _remember(entry, key)
        return Shipped(remote_entry, 0, 0)
    base, reuse = _base(entry, key, files)
    if reuse:
        # A changed tree: only its changed files sent, the rest copied there from
        # the last entry shipped. Checked like a whole one; one that fails (the
        # base changed there) is sent whole.
        data = _tar(entry, kind, reuse)
        src = shlex.quote(f"{Path(remote_entry).parent}/{base}/{kind}")
        take = (
            f'cd {src} && tar -c --null -T "$T"/{REUSE_FILE} -f - | tar -x -p --no-same-owner -f - '
            f'-C "$T"/{shlex.quote(kind)} && rm -f "$T"/{REUSE_FILE}'
        )
        if _write(login, entry, remote_entry, store, data, take, sums, kind, len(files), whole=False):
            _remember(entry, key)
            return Shipped(remote_entry, len(files) - len(reuse), len(data))
    data = _tar(entry)
    if not _write(login, entry, remote_entry, store, data, "", sums, kind, len(files), whole=True):
        raise RemoteError(f"{login.host}: {remote_entry} does not match the code sent: submit again")
    _remember(entry, key)
    return Shipped(remote_entry, len(files), len(data))


def _write(
    login: Login, entry: Path, remote_entry: str, store: str, data: bytes, take: str, sums: bytes,
    kind: str, n_files: int, *, whole: bool,
) -> bool:  # fmt: skip
    """``data`` unpacked beside ``remote_entry`` (then ``take``: the base's
    files copied in), renamed into place and checked: True when it matches.
    A folder that cannot be written raises :class:`RemoteError` (a delta's
    failure only when ``whole``: the whole entry is sent next)."""
    q = shlex.quote(remote_entry)
    # Unpacked beside the entry, then renamed into place (a damaged entry is replaced, never patched).
    unpack = (
        f"umask 077 && mkdir -p {shlex.quote(str(Path(remote_entry).parent))} && T=$(mktemp -d {q}.ship-XXXXXX) && "
        f'{{ tar -x -p --no-same-owner -f - -C "$T" && {take or "true"} && '
        f'{{ chmod -R u+w {q} 2>/dev/null; rm -rf {q}; }} && mv -T "$T" {q} || {{ rm -rf "$T"; exit 1; }}; }}'
    )
    done = remote_run(login, ["tar", "-x"], line=unpack, stdin=data, timeout=SHIP_TIMEOUT_S)
    if done.returncode:
        if not whole:
            return False
        raise RemoteError(
            f"{login.host}: the code could not be written to {remote_entry} ({done.stderr.strip()[:300]}): "
            f"check that {store} is a folder you may write there"
        )
    again = remote_run(login, ["sh"], line=_check_line(q, kind, n_files), stdin=sums, timeout=SHIP_TIMEOUT_S)
    return again.returncode == 0


def local_store_root() -> Path:
    """The laptop's own runs root for code snapshots made to be shipped."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "meshrun", "ssh")


def ship_meshrun(login: Login, cfg: RunConfig, field: str = "launcher.runs_root") -> tuple[Shipped, Path]:
    """This machine's meshrun code, snapshotted as a run's (``cfg``'s
    launcher.code and includes), made an entry of the local store, shipped to
    ``<cfg.launcher.runs_root>/.code`` on the login node; (what was shipped,
    the local store). The same tree as the last submission sends nothing."""
    here = dataclasses.replace(
        cfg, launcher=dataclasses.replace(cfg.launcher, runs_root=str(local_store_root()))
    )
    local = store_root(here)
    store = check_store_path(f"{cfg.launcher.runs_root.rstrip('/')}/{STORE_DIR}", field)
    tree, _ = plan_code(here)
    entry, _ = store_tree(tree, local, "meshrun")
    return ship_entry(login, Path(entry).parent, store, field=field), local
