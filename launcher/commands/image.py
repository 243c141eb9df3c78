"""``python -m launcher.image build``: the Enroot image a run's tasks start from.

    python -m launcher.image build --base nvcr.io#nvidia/pytorch:25.01-py3 --out /shared/images/meshrun.sqsh
    python -m launcher.image build --base ./debian-python.sqsh --out images/meshrun.sqsh --deps copy

From a base image (a registry reference, imported with ``enroot import``, or
a local ``.sqsh``) it creates an Enroot container, installs meshrun's runtime
dependencies at the versions installed with this checkout, exports a
``.sqsh`` with its content digest (``<out>.digest.json``, which submissions
read instead of hashing the file again) and prints the overrides to use.

Dependencies (``--deps``):
- ``pip`` (default): ``pip install`` inside the container, pinned to this
  environment's versions (``name==version``); ``--keep`` names packages the
  base already provides and that must not be replaced (default ``torch``:
  a base such as NGC's ships its CUDA build). Needs network (or
  ``--pip-args '--no-index --find-links /wheels'`` with a mounted wheelhouse).
  Index credentials: export ``PIP_INDEX_URL`` / ``PIP_EXTRA_INDEX_URL`` (or
  any ``PIP_*``); they and ``--pip-args`` reach pip in the container through
  its environment, never a command line, and errors show them masked
  (docs/security.md).
- ``copy``: no network: copies the installed files of every runtime
  distribution (their RECORD) from this interpreter's site-packages into the
  image's site-packages. The image's python must have this interpreter's
  major.minor version (the same ABI).

The checkout's code is not baked in: jobs mount it (cluster.container_workdir).
Needs ``enroot`` on PATH; runs where the image will be written (a login or
build node with the shared filesystem).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from launcher.config.prog import describe, plain, prog
from launcher.slurm.imagebuild import ImageError, build


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog("python -m launcher.image"),
        # The first paragraph as one line, the rest as written; no reST markup.
        description=describe(__doc__) + "\n\n" + plain((__doc__ or "").strip().split("\n\n", 1)[-1]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build a .sqsh with meshrun's runtime dependencies")
    b.add_argument(
        "--base", required=True, help="registry ref (nvcr.io#nvidia/pytorch:25.01-py3) or local .sqsh"
    )
    b.add_argument("--out", required=True, help="the .sqsh to write (a shared path the nodes see)")
    b.add_argument(
        "--deps", choices=("pip", "copy"), default="pip", help="how dependencies get in (see above)"
    )
    b.add_argument("--python", default="python3", help="the image's interpreter (default: python3)")
    b.add_argument("--keep", default="torch", help="comma list the base provides (pip mode; default: torch)")
    b.add_argument("--pip-args", default="", help="extra pip install arguments, e.g. '--index-url URL'")
    args = parser.parse_args(argv)
    try:
        rec = build(
            args.base,
            args.out,
            deps=args.deps,
            python=args.python,
            keep=[k for k in args.keep.split(",") if k],
            pip_args=args.pip_args,
        )
    except ImageError as e:
        print(f"meshrun image: error: {e}", file=sys.stderr)
        return 2
    print(f"meshrun image: {rec['image']} {rec['digest']} ({rec['size']} bytes, {rec['build_seconds']} s)")
    print(
        f"meshrun image: use: cluster.container_image={rec['image']} "
        f"cluster.container_python={shlex.quote(str(rec['python']))}"
    )
    return 0
