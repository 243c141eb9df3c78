"""The Enroot image a run's tasks start from: a base image plus meshrun's
runtime dependencies pinned to this environment, exported as a ``.sqsh`` with
its content digest (:func:`build`; the command, ``meshrun image build``:
launcher/commands/image.py, whose help says what each option does).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from launcher.config.image_ref import is_local, resolve_image
from launcher.config.secrets import mask
from launcher.slurm.container import DIGEST_SUFFIX, file_digest

CHECKOUT = Path(__file__).resolve().parents[2]
MANIFEST_IN_IMAGE = "/etc/meshrun-image.json"


PIP_ARGS_ENV = "MESHRUN_PIP_ARGS"
# pip in the image, its extra arguments read from PIP_ARGS_ENV (removed before
# pip runs, so its build subprocesses do not inherit them).
PIP_FROM_ENV = (
    "import os, runpy, shlex, sys; "
    f"sys.argv = ['pip', *sys.argv[1:], *shlex.split(os.environ.pop({PIP_ARGS_ENV!r}, ''))]; "
    "runpy.run_module('pip', run_name='__main__', alter_sys=True)"
)
ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ImageError(RuntimeError):
    """A build that cannot proceed; the message says what to change."""


def runtime_requirements() -> list[str]:
    """meshrun's runtime dependencies as declared by this checkout."""
    pyproject = CHECKOUT / "pyproject.toml"
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # pragma: no cover - 3.10
        return list(metadata.requires("meshrun") or [])
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [str(d) for d in deps]


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0]


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_closure(requirements: Sequence[str]) -> dict[str, metadata.Distribution]:
    """Installed distributions needed by ``requirements`` (transitively),
    markers evaluated for this interpreter; extras are not followed."""
    from packaging.requirements import Requirement

    out: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = _canon(req.name)
        if key in out:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError as e:
            raise ImageError(
                f"{req.name} (a runtime dependency of meshrun) is not installed here: "
                "run scripts/setup.sh first, so the image gets this checkout's versions"
            ) from e
        out[key] = dist
        todo += [Requirement(r) for r in dist.requires or []]
    return out


def pinned(dists: dict[str, metadata.Distribution], keep: Sequence[str] = ()) -> list[str]:
    skip = {_canon(k) for k in keep}
    return sorted(f"{d.metadata['Name']}=={d.version}" for k, d in dists.items() if k not in skip)


def _run(args: list[str], *, what: str, capture: bool = False, env: dict[str, str] | None = None) -> str:
    """Run a build step; its error shows the command and output masked (a
    URL's user:token@, token shapes: launcher/config/secrets.py)."""
    try:
        out = subprocess.run(args, check=True, text=True, capture_output=capture, env=env)
    except FileNotFoundError as e:
        raise ImageError(f"{args[0]} not found: {what} needs Enroot on this machine's PATH") from e
    except subprocess.CalledProcessError as e:
        tail = mask(((e.stderr or "") + (e.stdout or "")).strip()[-2000:])
        shown = shlex.join(mask(a) for a in args)
        raise ImageError(f"{what} failed (exit {e.returncode}): {shown}\n{tail}") from e
    return out.stdout if capture else ""


def _copy_list(dists: dict[str, metadata.Distribution]) -> tuple[Path, list[str]]:
    """This interpreter's site-packages dir and the files (relative to it) of
    ``dists``; files outside it (console scripts) are left out."""
    site = None
    files: list[str] = []
    for dist in dists.values():
        base = Path(str(dist.locate_file(""))).resolve()
        site = site or base
        if base != site:
            raise ImageError(
                f"{dist.metadata['Name']} is installed in {base}, not {site}: --deps copy needs one "
                "site-packages; use --deps pip"
            )
        for f in dist.files or []:
            rel = os.path.normpath(str(f))
            if rel.startswith("..") or rel.endswith(".pyc") or not (site / rel).is_file():
                continue
            files.append(rel)
    assert site is not None
    return site, sorted(set(files))


def build(
    base: str,
    out: str,
    *,
    deps: str = "pip",
    python: str = "python3",
    keep: Sequence[str] = ("torch",),
    pip_args: str = "",
    log=print,  # noqa: ANN001 - a print-like callable
) -> dict[str, object]:
    """Build ``out`` from ``base``; returns the record written next to it."""
    t0 = time.monotonic()
    base, out = _check_paths(base, out)
    dists = dependency_closure(runtime_requirements())
    reqs = pinned(dists, keep if deps == "pip" else ())
    name = f"meshrun-build-{os.getpid()}-{int(time.time())}"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="meshrun-image-", dir=str(Path(out).parent)) as tmp:
        stage = Path(tmp)
        base_file = _import_base(base, stage, log)
        _run(["enroot", "create", "--name", name, base_file], what="enroot create", capture=True)
        try:
            start = ["enroot", "start", "--rw", "--root", "--mount", f"{stage}:/meshrun-build"]
            (major, minor), purelib, image_python = _probe_python(start, name, python)
            (stage / "requirements.txt").write_text("\n".join(reqs) + "\n")
            if deps == "copy":
                _copy_deps(start, name, stage, dists, (major, minor), purelib, image_python, log)
            else:
                _pip_deps(start, name, python, reqs, keep, pip_args, log)
            manifest = {
                "base": base,
                "deps": deps,
                "python": image_python,
                "requirements": reqs,
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            tmp_out = _finish_image(start, name, stage, manifest, log)
        finally:
            subprocess.run(["enroot", "remove", "--force", name], capture_output=True, check=False)
        os.replace(tmp_out, out)
    st = os.stat(out)
    rec: dict[str, object] = {
        **manifest,
        "image": out,
        "digest": file_digest(out),
        "size": st.st_size,
        "mtime": int(st.st_mtime),
        "build_seconds": round(time.monotonic() - t0, 1),
    }
    Path(out + DIGEST_SUFFIX).write_text(json.dumps(rec, indent=2) + "\n")
    return rec


def _check_paths(base: str, out: str) -> tuple[str, str]:
    """The resolved base and output images; refused before any work."""
    if shutil.which("enroot") is None:
        raise ImageError("enroot not found on PATH: build images on a node with Enroot installed")
    base = resolve_image(base)
    out = resolve_image(out if out.endswith(".sqsh") else out + ".sqsh")
    if is_local(base) and not os.path.isfile(base):
        raise ImageError(f"--base {base!r}: no such file (a local .sqsh, or a registry reference)")
    if os.path.exists(out):
        raise ImageError(f"--out {out!r} exists: choose a new path (images are immutable once used)")
    return base, out


def _import_base(base: str, stage: Path, log) -> str:  # noqa: ANN001 - a print-like callable
    """The base image as a local .sqsh (imported into ``stage`` from a registry)."""
    if is_local(base):
        return base
    ref = base if "://" in base else f"docker://{base}"
    log(f"meshrun image: importing {ref}")
    base_file = str(stage / "base.sqsh")
    _run(["enroot", "import", "--output", base_file, ref], what="enroot import")
    return base_file


def _probe_python(start: list[str], name: str, python: str) -> list[Any]:
    """((major, minor), purelib, executable) of ``python`` in the container."""
    probe = "import sys, sysconfig, json; print(json.dumps([sys.version_info[:2], sysconfig.get_paths()['purelib'], sys.executable]))"
    info = _run([*start, name, python, "-c", probe], what=f"running {python} in the base image", capture=True)
    return json.loads(info.strip().splitlines()[-1])


def _copy_deps(
    start: list[str],
    name: str,
    stage: Path,
    dists: Any,
    version: tuple[int, int],
    purelib: str,
    image_python: str,
    log,  # noqa: ANN001 - a print-like callable
) -> None:
    """--deps copy: this host's installed distributions, file by file."""
    major, minor = version
    if (major, minor) != tuple(sys.version_info[:2]):
        raise ImageError(
            f"--deps copy needs python {sys.version_info[0]}.{sys.version_info[1]} in the image "
            f"(it has {major}.{minor} at {image_python}); use --deps pip"
        )
    site, files = _copy_list(dists)
    (stage / "files").write_text("\n".join(files) + "\n")
    log(f"meshrun image: copying {len(dists)} distributions ({len(files)} files) into {purelib}")
    script = f"mkdir -p {shlex.quote(purelib)} && cd /meshrun-host-site && xargs -d '\\n' -a /meshrun-build/files cp --parents -t {shlex.quote(purelib)}"
    _run(
        [*start, "--mount", f"{site}:/meshrun-host-site",
         name, "sh", "-c", script],
        what="copying the dependencies into the image",
    )  # fmt: skip


def _pip_deps(
    start: list[str],
    name: str,
    python: str,
    reqs: list[str],
    keep: Sequence[str],
    pip_args: str,
    log,  # noqa: ANN001 - a print-like callable
) -> None:
    """--deps pip: pip install of the pinned requirements in the image."""
    log(
        f"meshrun image: pip install of {len(reqs)} pinned requirements (kept from the base: {', '.join(keep) or 'none'})"
    )
    if mask(pip_args) != pip_args:
        log(
            "meshrun image: warning: --pip-args holds a credential, which this command's own argv shows "
            "(ps): export PIP_INDEX_URL / PIP_EXTRA_INDEX_URL instead (docs/security.md)"
        )
    # --pip-args and the PIP_* variables (an index URL with its token) reach
    # pip through the environment, never an argv (ps shows every argv).
    pip_env = [k for k in sorted(os.environ) if k.startswith("PIP_") and ENV_WORD.match(k)]
    _run(
        [*start, "--env", PIP_ARGS_ENV, *(a for k in pip_env for a in ("--env", k)), name, python, "-c",
         PIP_FROM_ENV, "install", "--no-cache-dir", "-r", "/meshrun-build/requirements.txt"],
        what="pip install in the image",
        env={**os.environ, PIP_ARGS_ENV: pip_args},
    )  # fmt: skip


def _finish_image(
    start: list[str],
    name: str,
    stage: Path,
    manifest: dict[str, Any],
    log,  # noqa: ANN001 - a print-like callable
) -> str:
    """Write the manifest into the container and export it; the .sqsh path."""
    (stage / "image.json").write_text(json.dumps(manifest, indent=2) + "\n")
    _run(
        [*start, name, "cp", "/meshrun-build/image.json", MANIFEST_IN_IMAGE],
        what="writing the manifest",
    )
    tmp_out = str(stage / "out.sqsh")
    log("meshrun image: exporting")
    _run(["enroot", "export", "--output", tmp_out, name], what="enroot export", capture=True)
    return tmp_out
