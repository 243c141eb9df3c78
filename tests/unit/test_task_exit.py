"""A task's exit (train/__main__.py ``exit_unfinalized``): as the
interpreter's, without its finalization. Each case runs in a child
process, since the function ends the process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _exit_of(body: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(body) + "\nfrom train.__main__ import exit_unfinalized\nexit_unfinalized(3)\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)


def test_an_unshut_thread_pool_does_not_hold_the_exit() -> None:
    """A ThreadPoolExecutor never shut down (torch.compile's inductor keeps
    one): its idle workers leave at the exit, as under the interpreter;
    joined without threading's exit hooks, the task hung there."""
    out = _exit_of("""
        import concurrent.futures
        pool = concurrent.futures.ThreadPoolExecutor(2)
        assert [pool.submit(pow, 2, k).result() for k in range(4)] == [1, 2, 4, 8]
    """)
    assert out.returncode == 3, out.stderr


def test_threads_are_joined_then_atexit_runs_then_the_code() -> None:
    out = _exit_of("""
        import atexit, threading, time
        done = []
        threading.Thread(target=lambda: (time.sleep(0.5), done.append(1))).start()
        atexit.register(lambda: print("atexit after the thread:", done, flush=True))
    """)
    assert out.returncode == 3 and out.stdout == "atexit after the thread: [1]\n", (out.stdout, out.stderr)
