"""``python -m train.inprocess.storehost``: the TCPStore in-process recovery
meets on (train/inprocess/rendezvous.py), in a process of its own so that it
outlives any rank. Prints ``port <n>`` once listening; exits when its stdin
closes (the launcher that started it ended, however it ended)."""

from __future__ import annotations

import sys

import torch.distributed as dist


def main() -> int:
    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    print(f"port {store.port}", flush=True)
    for _ in sys.stdin:  # nothing is sent: this waits for EOF
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
