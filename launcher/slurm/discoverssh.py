"""What ``meshrun init --login`` reads on the login node beside Slurm's own
answers: its InfiniBand NICs (sysfs), enroot, whether the SPANK plugstack
loads Pyxis, and a Python there that has meshrun's packages (the preset's
``cluster.python``, what a submission over SSH runs meshrun with). Each is
one shell line over the shared connection (launcher/slurm/remote.py), every
word from outside the line quoted.
"""

from __future__ import annotations

import re
import shlex

from launcher.config.validate import Login
from launcher.slurm.remote import RemoteError, how_to_try, remote_run

# The first port's rate and link layer of each NIC, then enroot: one line per fact.
HOST_LINE = (
    'for d in /sys/class/infiniband/*; do [ -d "$d" ] || continue; '
    'echo "nic ${d##*/} $(cut -d" " -f1 "$d/ports/1/rate" 2>/dev/null) '
    '$(cat "$d/ports/1/link_layer" 2>/dev/null)"; done; '
    'e=$(command -v enroot) && echo "enroot $e $(enroot version 2>/dev/null)"; true'
)
# What meshrun needs of the Python that runs it on the login node (pyproject's
# requires-python and the launcher's imports); prints its own path when it fits.
PY_CHECK = "import sys; assert sys.version_info >= (3, 10), sys.version; import hydra, omegaconf, yaml; print(sys.executable)"
PY_CANDIDATES = ("python3", "python")
PACKAGES = "hydra-core, omegaconf, PyYAML"


def host_facts(login: Login) -> tuple[list[str], float, str, str]:
    """(NIC names, the first NIC's rate in Gbit/s, its link layer, enroot's path and version)."""
    out = remote_run(login, ["sh"], line=HOST_LINE)
    nics: list[str] = []
    rate, link, enroot = 0.0, "", ""
    for ln in out.stdout.splitlines():
        word, _, rest = ln.partition(" ")
        if word == "nic" and rest:
            name, *more = rest.split()
            nics.append(name)
            if len(nics) == 1 and more and re.fullmatch(r"[\d.]+", more[0]):
                rate, link = float(more[0]), " ".join(more[1:])
        elif word == "enroot":
            enroot = rest.strip()
    return nics, rate, link, enroot


def loads_pyxis(text: str) -> bool:
    """Does plugstack text (a file and the ones it includes) load Pyxis?"""
    return any("spank_pyxis" in ln and not ln.lstrip().startswith("#") for ln in text.splitlines())


def remote_pyxis(login: Login, plugstack: str) -> bool:
    """Pyxis in the login node's plugstack (``PlugStackConfig``, default
    /etc/slurm/plugstack.conf, and its plugstack.conf.d/)."""
    path = plugstack if plugstack and plugstack != "(null)" else "/etc/slurm/plugstack.conf"
    q = shlex.quote(path)
    line = f'cat -- {q} "$(dirname -- {q})"/plugstack.conf.d/* 2>/dev/null; true'
    return loads_pyxis(remote_run(login, ["cat", path], line=line).stdout)


def find_python(login: Login, given: str = "") -> str:
    """The login node's Python for meshrun: ``given`` (checked there), else
    the first of python3, python on its PATH with meshrun's packages, as its
    full path. :class:`RemoteError` (the host and the fix) when none fits."""
    said = []
    for py in [given] if given else PY_CANDIDATES:
        line = f"command -v {shlex.quote(py)} >/dev/null 2>&1 || exit 127; exec {shlex.join([py, '-c', PY_CHECK])}"
        out = remote_run(login, [py, "-c", "import hydra"], line=line)
        path = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
        if out.returncode == 0 and re.fullmatch(r"/[A-Za-z0-9_./+-]+", path):
            return given or path
        why = "not found" if out.returncode == 127 else (out.stderr.strip().splitlines() or ["no answer"])[-1]
        said.append(f"{py}: {why[:160]}")
    fix = "give another" if given else "give one"
    raise RemoteError(
        f"{login.host}: no Python there with meshrun's packages ({PACKAGES}, Python >= 3.10): "
        f"{'; '.join(said)}; {fix} with --python /path/on/the/login/node/venv/bin/python "
        f"(there: python3 -m venv ~/meshrun-venv && ~/meshrun-venv/bin/pip install {PACKAGES.replace(',', '')}), "
        f"checked with `{how_to_try(login)} PYTHON -c 'import hydra'`"
    )
