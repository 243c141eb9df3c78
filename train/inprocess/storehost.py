"""``python -m train.inprocess.storehost``: the TCPStore in-process recovery
meets on (train/inprocess/rendezvous.py), in a process of its own so that it
outlives any rank. Prints ``port <n>`` once listening; exits when its stdin
closes (the launcher that started it ended, however it ended); until then
each ``hung <generation> <rank>`` line on it is kept in ``hung/<generation>``
(a rank the launcher killed as hung: the ranks' fault record says so), and
each ``dead <rank> <incarnation>`` flags the live generation's fault when
that process of the rank was in it (train/inprocess/missing.py ``flag_dead``). It ignores
USR2: under Slurm the time limit's USR2 reaches every step of the job, this
one too, and the ranks still need the store while they save and stop.

It also watches for a hung rank (train/inprocess/missing.py): after a fault, a
rank that neither left the broken generation nor came to the next one
within one collective timeout is printed as ``missing <generation>
<rank>,...``; the launcher that reads the line (launcher/run/local.py,
launcher/selfheal/inprocess.py) kills it unless it is a replacement still
starting, and replaces it as a dead rank."""

from __future__ import annotations

import datetime
import signal
import sys
import threading

import torch.distributed as dist

from train.inprocess.missing import flag_dead, watch_missing
from train.inprocess.rendezvous import HUNG_PREFIX

_WAIT = datetime.timedelta(days=7)


def main() -> int:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    print(f"port {store.port}", flush=True)
    client = dist.TCPStore("127.0.0.1", store.port, world_size=None, is_master=False, timeout=_WAIT)
    threading.Thread(target=watch_missing, args=(client, lambda s: print(s, flush=True)), daemon=True).start()
    # The launcher's word (StoreChannel in launcher/run/localrecovery.py); EOF: the end.
    for line in sys.stdin:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "hung" and parts[1].isdigit() and parts[2].isdigit():
            client.append(f"{HUNG_PREFIX}{int(parts[1])}", f"{int(parts[2])},")
        elif len(parts) == 3 and parts[0] == "dead" and parts[1].isdigit() and parts[2].isdigit():
            flag_dead(client, int(parts[1]), int(parts[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
