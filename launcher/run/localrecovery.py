"""The local launcher's part in in-process recovery (launcher.in_process_recovery,
launcher/run/local.py runs the ranks): the store host the ranks'
generations meet on, and its word of a hung rank. On Slurm the supervisor
does the same (launcher/selfheal/inprocess.py), with these names."""

from __future__ import annotations

import contextlib
import queue
import subprocess
import sys
import threading

from launcher.config.health import read_faults
from launcher.config.spec import RunSpec
from launcher.config.warmspare import SPARE_ENV

RECOVERY_STORE_ENV = "MESHRUN_RECOVERY_STORE"


def recoveries_done(run_dir: str) -> int:
    """In-process recoveries whose first resumed step is done: their
    ``resumed`` records (train/loop/resilient.py writes one after that step)."""
    return sum(
        r.get("event") == "resumed" and r.get("recovery") == "in_process" for r in read_faults(run_dir)
    )


def spare_env(env: dict[str, str], store_address: str) -> dict[str, str]:
    """A warm spare's environment from a rank's: no rank of its own yet
    (launcher/config/warmspare.py gives it one), the store host's address."""
    out = {k: v for k, v in env.items() if k not in ("RANK", "LOCAL_RANK", "GROUP_RANK")}
    out.update({RECOVERY_STORE_ENV: store_address, SPARE_ENV: "1"})
    return out


class StoreHost:
    """``python -m train.inprocess.storehost``: the TCPStore the ranks'
    generations meet on, in its own process so it outlives any rank."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "train.inprocess.storehost"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"the in-process recovery store did not start (it said {line!r})")
        self.address = f"127.0.0.1:{int(line.split()[1])}"
        self.channel = StoreChannel(self.proc)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin:
                self.proc.stdin.close()  # its signal to exit
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class StoreChannel:
    """The store host's word after its ``port`` line, and ours to it
    (train/inprocess/storehost.py): it says ``missing <generation>
    <rank>:<incarnation>,...`` (ranks neither leaving a broken generation nor
    coming to the next, with the incarnation that was in the broken one);
    the launcher that kills one as hung says ``hung <generation> <rank>``,
    which the store keeps for the ranks' fault record, and ``dead <rank>
    <incarnation>`` for each rank process it sees die
    (launcher/config/warmspare.py: 0 for the rank's first process, n for its
    n-th replacement)."""

    def __init__(self, proc: subprocess.Popen[str], wake: threading.Event | None = None) -> None:
        self.proc = proc
        self.missing: queue.Queue[tuple[int, list[tuple[int, int | None]]]] = queue.Queue()
        self.wake = wake or threading.Event()  # set at each missing line: the launcher acts now
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            found = missing_ranks(line)
            if found is not None:
                self.missing.put(found)
                self.wake.set()

    def note_hung(self, gen: int, rank: int) -> None:
        self._say(f"hung {gen} {rank}")

    def note_dead(self, rank: int, incarnation: int) -> None:
        """``rank``'s process ``incarnation`` died: the survivors abort now,
        not when one of them hits the dead rank (said before its replacement
        starts; the incarnation keeps a late word off the replacement)."""
        self._say(f"dead {rank} {incarnation}")

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # a store host gone: its ranks time out instead
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()


def missing_ranks(line: str) -> tuple[int, list[tuple[int, int | None]]] | None:
    """(generation, [(rank, incarnation)]) of the store host's ``missing
    <generation> <r>:<i>,<r>`` line (incarnation None: a bare rank, none of
    whose processes was in the broken generation); None for any other line."""
    parts = line.split()
    if len(parts) != 3 or parts[0] != "missing" or not parts[1].isdigit():
        return None
    named: list[tuple[int, int | None]] = []
    for item in parts[2].split(","):
        rank, colon, inc = item.partition(":")
        if not rank.isdigit() or (colon and not inc.isdigit()):
            return None
        named.append((int(rank), int(inc) if inc else None))
    return int(parts[1]), named


def recovery_store(spec: RunSpec) -> StoreHost | None:
    """The store host when launcher.in_process_recovery is on (meshrun's trainer only)."""
    if not spec.cfg.launcher.in_process_recovery or spec.cfg.job.kind not in ("pretrain", "finetune"):
        return None
    return StoreHost()
