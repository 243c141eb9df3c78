"""The in-process recovery's rendezvous at scale: what one store host
(train/inprocess/storehost.py, one TCPStore) costs when N ranks meet again
after a fault.

    PYTHONPATH=. python scripts/bench_rendezvous.py [--ranks 1024 4096]
    PYTHONPATH=. python scripts/bench_rendezvous.py --quick   # seconds (CI)

Each simulated rank is a thread with its own store client, as a rank's
watcher has (train/inprocess/rendezvous.py), connected before the clock
starts. The store host runs in its own
process, as in a run. Timed from the moment the first rank flags the fault
(``Rendezvous.flag_fault``) until every rank has done its share of the
rendezvous's store operations:

- the watcher's wait on ``fault/<g>`` returns (the fan-out to N waiters);
- ``flag_fault`` (two compare_set: every rank leaves through it);
- ``current()`` (one add): the generation to join;
- the new world group's communicator id: rank 0 sets it, every other rank
  gets it (NCCL's init through a store: one get per rank);
- ``joined/<g>`` (one add);
- the peer copies' group: a store barrier (one add, then a wait on the key
  the last rank sets).

Eight operations a rank, none reading another rank's key: the cost is the
store's throughput, O(N) on one host, spread over N clients. The clients
share this machine's cores with the store host (on a cluster each rank has
its own host): the figure is an upper bound. The gloo or NCCL connections
themselves are not in it. Last line: ``bench_rendezvous: ranks=N seconds=S
ops_per_s=R at_16384_s=T``, T the 16,384-rank time at the largest N's
measured throughput (linear in N: the model above).
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS_PER_RANK = 8
SCALE = 16384
QUICK_RANKS = (64, 256)
THREADS_PER_PROC = 256


def _rank_thread(host: str, port: int, rank: int, n: int, gen: int, ready: threading.Barrier,
                 done: list[float], errors: list[str]) -> None:  # fmt: skip
    import torch.distributed as dist

    from train.inprocess.rendezvous import GEN_KEY

    try:
        t = datetime.timedelta(seconds=120)
        store = dist.TCPStore(host, port, world_size=None, is_master=False, timeout=t)
    except Exception as e:  # a client that cannot connect: said, and no one waits for it
        errors.append(f"rank {rank}: {type(e).__name__}: {e}")
        ready.abort()
        return
    ready.wait()
    store.wait([f"fault/{gen}"])  # the watcher: woken by the first flag
    store.compare_set(f"fault/{gen}", "", f"rank {rank} saw it too")  # flag_fault
    store.compare_set(GEN_KEY, str(gen), str(gen + 1))
    nxt = int(store.add(GEN_KEY, 0))  # current()
    if rank == 0:
        store.set(f"gen{nxt}/uid", b"x" * 128)  # a communicator id's size
    else:
        store.get(f"gen{nxt}/uid")
    store.add(f"joined/{nxt}", 1)
    if int(store.add(f"gen{nxt}/peer/arrived", 1)) == n:  # the copies' group: a store barrier
        store.set(f"gen{nxt}/peer/done", b"1")
    store.wait([f"gen{nxt}/peer/done"])
    done[rank] = time.time()


def _proc(host: str, port: int, ranks: list[int], n: int, gen: int, q: mp.Queue) -> None:
    threading.stack_size(256 * 1024)
    done, errors = [0.0] * n, []
    ready = threading.Barrier(len(ranks) + 1)
    threads = [
        threading.Thread(target=_rank_thread, args=(host, port, r, n, gen, ready, done, errors), daemon=True)
        for r in ranks
    ]
    for th in threads:
        th.start()
    try:
        ready.wait()
        q.put("ready")
        for th in threads:
            th.join()
        q.put(max(done[r] for r in ranks))
    except threading.BrokenBarrierError:
        q.put(f"{len(errors)} client(s) could not connect, the first: {errors[0] if errors else '?'}")
    q.close()
    q.join_thread()
    os._exit(0)  # a thousand clients' teardown is not what is measured


def one(port: int, n: int, gen: int) -> float:
    """Seconds from the fault's flag (generation ``gen``) to the last of ``n``
    ranks through the rendezvous."""
    import torch.distributed as dist

    from train.inprocess.rendezvous import GEN_KEY

    main = dist.TCPStore("127.0.0.1", port, world_size=None, is_master=False)
    main.compare_set(GEN_KEY, "", str(gen))  # the run's start writes it (a missing key is not compared)
    assert int(main.add(GEN_KEY, 0)) == gen, "the store host's generation is not this round's"
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    groups = [list(range(i, min(n, i + THREADS_PER_PROC))) for i in range(0, n, THREADS_PER_PROC)]
    procs = [ctx.Process(target=_proc, args=("127.0.0.1", port, g, n, gen, q)) for g in groups]
    for p in procs:
        p.start()
    for _ in procs:
        said = q.get(timeout=600)
        if said != "ready":
            for p in procs:
                p.kill()
            raise RuntimeError(f"bench_rendezvous: {n} ranks: {said}")
    t0 = time.time()
    main.compare_set(f"fault/{gen}", "", "rank 7 lost")  # the first rank to see the fault
    last = max(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    return last - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 8192])
    ap.add_argument("--quick", action="store_true", help="64 and 256 ranks (seconds)")
    args = ap.parse_args()
    ranks = QUICK_RANKS if args.quick else tuple(args.ranks)
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one connection a simulated rank
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # a line per client at the host's exit
    # Each store client's connect asks DNS for its address's name (torch's
    # c10d names the socket); a resolver that drops a burst of them would
    # stall each connect for its 5 s default: bound that (the connects are
    # made before the clock, so this only keeps the run short).
    os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
    print(f"{'ranks':>6} {'seconds':>8} {'store ops/s':>12}   ({OPS_PER_RANK} store operations a rank)")
    rate = secs = 0.0
    # One store host for every size, as a run's outlives its generations.
    host = subprocess.Popen([sys.executable, "-m", "train.inprocess.storehost"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    try:
        port = int((host.stdout.readline() if host.stdout else "port ?").split()[1])
        for gen, n in enumerate(ranks):
            secs = one(port, n, gen)
            rate = n * OPS_PER_RANK / secs
            print(f"{n:>6} {secs:>8.3f} {rate:>12,.0f}", flush=True)
    finally:
        if host.stdin:
            host.stdin.close()
        host.wait(timeout=30)
    at_scale = SCALE * OPS_PER_RANK / rate
    print(f"at {SCALE:,} ranks (the largest run's throughput, linear in ranks): {at_scale:.2f} s")
    print(
        f"bench_rendezvous: ranks={ranks[-1]} seconds={secs:.3f} ops_per_s={rate:.0f} at_16384_s={at_scale:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
