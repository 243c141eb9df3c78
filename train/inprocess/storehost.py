"""``python -m train.inprocess.storehost``: the TCPStore in-process recovery
meets on (train/inprocess/rendezvous.py), in a process of its own so that it
outlives any rank. Prints ``port <n>`` once listening; exits when its stdin
closes (the launcher that started it ended, however it ended). It ignores
USR2: under Slurm the time limit's USR2 reaches every step of the job, this
one too, and the ranks still need the store while they save and stop."""

from __future__ import annotations

import signal
import sys

import torch.distributed as dist


def main() -> int:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    print(f"port {store.port}", flush=True)
    for _ in sys.stdin:  # nothing is sent: this waits for EOF
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
