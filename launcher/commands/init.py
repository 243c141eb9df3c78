"""``meshrun init``: write a cluster preset (and QOS presets) from the real cluster.

Run on a login node, or from a laptop with ``--login user@host[:port]``:
then the login node's Slurm and host are asked over the user's own ssh
(launcher/slurm/remote.py, launcher/slurm/discoverssh.py) and the preset
gets ``login:`` and ``python:`` (a Python there with meshrun's packages,
found or given with ``--python``), so runs from the laptop submit over SSH.
Reads the cluster (launcher/slurm/discover.py: read-only
sinfo / scontrol / sacctmgr queries, the InfiniBand NICs, enroot), prints what
it found, and writes ``cluster/<name>.yaml`` and one ``qos/<name>_<partition>.yaml``
per partition you may use into your config directory
(launcher/config/userconf.py), which every composition searches too. An
existing preset is never overwritten without --force.

    meshrun init [--name NAME] [--force] [--dry-run] [FIELD=VALUE ...]
    meshrun init --login alice@login.example[:port] [--python /opt/venv/bin/python] ...

FIELD=VALUE sets a cluster preset field the cluster cannot tell
(gpu_mem_gb=80, price_on_demand_usd_per_node_hour=98).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from launcher.config.compose import CONF_DIR
from launcher.config.userconf import user_conf_dir
from launcher.config.validate import PYTHON, ConfigError, Login, parse_login
from launcher.slurm.cluster import SlurmError
from launcher.slurm.discover import ClusterFacts, discover
from launcher.slurm.discoverssh import find_python
from launcher.slurm.initpreset import cluster_field_sets, cluster_preset, found_lines, qos_presets
from launcher.slurm.remote import RemoteError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _error(msg: str, code: int = 2) -> int:
    print(f"meshrun: error: {msg}", file=sys.stderr)
    return code


def _read(login: Login | None, python: str) -> tuple[ClusterFacts, str]:
    """The cluster's facts (here, or behind ``login``) and, with ``login``,
    the Python there that runs meshrun (``python`` checked, else found)."""
    if login is None:
        return discover(), ""
    facts = discover(login=login)
    return facts, find_python(login, python)


def _yaml(header: str, values: dict[str, Any]) -> str:
    return f"# {header}\n" + yaml.safe_dump(values, sort_keys=False, default_flow_style=False)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="meshrun init",
        description="Write a cluster preset and QOS presets from the Slurm cluster this runs on "
        "(read-only queries), into the config directory every meshrun command composes from.",
        epilog=f"Config directory: $MESHRUN_CONFIG_DIR, default ~/.config/meshrun/conf (now: {user_conf_dir()}).",
    )
    ap.add_argument("--name", help="the preset's name (default: Slurm's ClusterName)")
    ap.add_argument("--force", action="store_true", help="overwrite presets of the same name")
    ap.add_argument("--dry-run", action="store_true", help="print the presets, write nothing")
    ap.add_argument(
        "--login",
        metavar="USER@HOST[:PORT]",
        help="from a machine without Slurm: ask the cluster behind this login node over ssh, and set "
        "the preset's login: (cluster.login) to it",
    )
    ap.add_argument(
        "--python",
        metavar="PY",
        help="--login: the login node's Python with meshrun's packages (default: python3 or python "
        "found there), the preset's python:",
    )
    ap.add_argument(
        "sets", nargs="*", metavar="FIELD=VALUE", help="cluster preset fields to set, e.g. gpu_mem_gb=80"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        sets = cluster_field_sets(args.sets)
    except ValueError as e:
        return _error(str(e))
    try:
        login = parse_login(args.login, "--login") if args.login else None
    except ConfigError as e:
        return _error(str(e))
    if args.python and (login is None or not PYTHON.match(args.python)):
        why = "names the login node's Python: give it with --login" if login is None else "is not a path"
        return _error(f"--python={args.python!r} is invalid: {why} (e.g. /opt/venv/bin/python)")
    try:
        facts, python = _read(login, args.python or "")
    except SlurmError as e:
        return _error(
            f"meshrun init reads the cluster it runs on: {e}"
            if login is None
            else f"meshrun init --login: {e}",
            3,
        )
    except RemoteError as e:
        return _error(f"meshrun init --login: {e} (no preset written)", 3)
    name = args.name or facts.name
    if not NAME_RE.match(name):
        return _error(f"--name={name!r} is invalid: letters, digits, '_', '.', '-' (choose --name)")
    if (Path(CONF_DIR) / "cluster" / f"{name}.yaml").exists():
        return _error(
            f"--name={name!r} is invalid: a bundled preset has that name (conf/cluster); choose --name"
        )
    cluster, notes = cluster_preset(facts, name, sets)
    if login is not None:  # what makes runs from here submit over SSH
        cluster["login"], cluster["python"] = str(login), python
    qos, qos_notes = qos_presets(facts, name)
    root = user_conf_dir()
    files = {
        root / "cluster" / f"{name}.yaml": cluster,
        **{root / "qos" / f"{q}.yaml": v for q, v in qos.items()},
    }
    print("meshrun init: found")
    for line in found_lines(facts):
        print(f"  {line}")
    for note in notes + qos_notes:
        print(f"meshrun init: note: {note}")
    header = f"Written by meshrun init from Slurm cluster {facts.name}; edit freely."
    if args.dry_run:
        for path, values in files.items():
            print(f"--- {path} (not written: --dry-run)\n{_yaml(header, values)}", end="")
        return 0
    existing = [str(p) for p in files if p.exists()]
    if existing and not args.force:
        return _error(
            f"--name={name!r}: {', '.join(existing)} exist(s); add --force to overwrite, or choose --name"
        )
    for path, values in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_yaml(header, values))
        print(f"meshrun init: wrote {path}")
    first = next(iter(qos), None)
    use = f"cluster={name}" + (f" qos={first}" if first else "")
    if cluster.get("gpus_per_node") and not cluster.get("gpu_mem_gb"):
        # A preset without its GPUs' memory is refused by every plan: say the fix first.
        print(
            f"meshrun init: before using it, give its GPUs' memory (a GPU type meshrun does not know): "
            f"meshrun init --name {name} --force gpu_mem_gb=GB [gpu_peak_bf16_tflops=T], "
            f"e.g. gpu_mem_gb=80; or per run: python -m launcher {use} cluster.gpu_mem_gb=GB"
        )
        return 0
    print(f"meshrun init: use it: python -m launcher {use} launcher.dry_run=true")
    if len(qos) > 1:
        print(f"meshrun init: other teams' partitions: {', '.join(f'qos={q}' for q in list(qos)[1:])}")
    return 0
