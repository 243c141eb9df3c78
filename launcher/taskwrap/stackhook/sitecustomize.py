"""First on a ``job=script`` program's PYTHONPATH (launcher/taskwrap/taskenv.py):
Python imports it at start, before the program's first line.

It registers :mod:`faulthandler` on SIGURG, meshrun's stack signal
(launcher/config/health.py), writing every thread's Python stack to the
program's stderr: the task wrapper reads it into the hang's stack file
(launcher/taskwrap/wrapper.py). SIGURG's default is to be ignored, so the
program is unchanged until a hang; a handler of its own replaces this one.
Faulthandler's handler is C code: it dumps a main thread blocked in a
collective. Then it takes itself off ``sys.path`` and imports the
``sitecustomize`` it shadows (a venv's or the system's), if any.
Standard library only: it runs in any interpreter the team brings.
"""

import os
import sys


def _register() -> None:
    import contextlib
    import faulthandler
    import signal

    # No stderr (a daemon), or a platform without it: the wrapper still answers.
    with contextlib.suppress(AttributeError, RuntimeError, ValueError, OSError):
        faulthandler.register(signal.SIGURG, file=sys.stderr, all_threads=True, chain=True)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    this = sys.modules.pop(__name__)
    try:
        import sitecustomize  # noqa: F401 - the one this file shadows
    except ModuleNotFoundError as e:
        if e.name != "sitecustomize":
            raise
        sys.modules[__name__] = this


if os.environ.get("MESHRUN_STACK_HOOK", "1") != "0":
    _register()
_chain()
