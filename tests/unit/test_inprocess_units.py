"""In-process recovery's pure parts: the partner pairing, the step every
needed copy holds (a partner pair lost: none, so the durable checkpoint),
and the refusals of launcher.in_process_recovery naming the field (a node
whose host memory cannot hold the peer copies, a world that cannot pair
ranks: refused before the run dir is written)."""

from __future__ import annotations

import copy
import math
import signal
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

from launcher.config.schema import (
    ClusterConfig,
    JobConfig,
    ModelConfig,
    ParallelismConfig,
    RunConfig,
    TrainConfig,
)
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan
from launcher.run.prepare import prepare
from train.inprocess.peerstate import agreed_step, holder_of, partner_offset


def test_partners_sit_one_node_over() -> None:
    assert partner_offset(8, 4, 2) == 4  # 2 nodes x 4: rank r's copy on the other node
    assert partner_offset(4, 4, 1) == 2  # cluster=local: half the ranks over, as 2 nodes x 2
    assert [holder_of(r, 16, partner_offset(16, 4, 4)) for r in (0, 3, 12, 15)] == [4, 7, 0, 3]
    with pytest.raises(ValueError, match="no partner"):
        partner_offset(1, 1, 1)


def test_the_newest_step_every_needed_copy_holds() -> None:
    # (own steps, held steps) per rank; rank 2 replaced (holds nothing); its holder is rank 0.
    everyone = [([9, 10], [9, 10]), ([9, 10], [9, 10]), ([], []), ([9, 10], [9, 10])]
    assert agreed_step(everyone, 2) == (10, [2])
    # A fault during an exchange: rank 0 did not receive rank 2's copy of step 10 yet.
    everyone[0] = ([9, 10], [8, 9])
    assert agreed_step(everyone, 2) == (9, [2])
    # Ranks 0 and 2 lost at once: each held the other's copy -> the durable checkpoint.
    assert agreed_step([([], []), ([9], [9]), ([], []), ([9], [9])], 2) == (None, [0, 2])
    # Ranks 0 and 1 lost: their copies are on ranks 2 and 3.
    assert agreed_step([([], []), ([], []), ([4, 5], [4, 5]), ([5], [5])], 2) == (5, [0, 1])


def _cfg(**kw) -> RunConfig:  # type: ignore[no-untyped-def]
    cfg = RunConfig(
        cluster=ClusterConfig(local_processes=4),
        model=ModelConfig(name="tiny", dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_dim=64, seq_len=16),
        train=TrainConfig(global_batch_size=4, steps=10),
        **kw,
    )
    cfg.launcher.in_process_recovery = True
    return cfg


def test_refusals_name_the_field() -> None:
    assert make_plan(_cfg()).world_size == 4  # data parallel on 4 ranks: accepted
    # Tensor and pipeline parallel: accepted (each rank's own shards, restored at the same rank).
    assert make_plan(_cfg(parallelism=ParallelismConfig(mode="fsdp_tp", tp=2))).tp == 2
    assert (
        make_plan(_cfg(parallelism=ParallelismConfig(mode="fsdp_tp_pp", tp=1, pp=2, stages_per_rank=1))).pp
        == 2
    )
    from launcher.config.compose import compose

    gpus = compose(["cluster=2node", "model=8b", "parallelism.cp=2", "launcher.in_process_recovery=true"])
    with pytest.raises(ConfigError, match=r"parallelism\.cp=2 .*not context parallel"):
        make_plan(gpus)
    cfg = _cfg()
    cfg.cluster.local_processes = 1
    with pytest.raises(ConfigError, match=r"launcher\.in_process_recovery.*at least 2 ranks"):
        make_plan(cfg)
    with pytest.raises(ConfigError, match=r"launcher\.in_process_recovery.*job\.kind=eval"):
        make_plan(_cfg(job=JobConfig(kind="eval")))
    cfg = _cfg()
    cfg.launcher.peer_copy_every_steps = 0
    with pytest.raises(ConfigError, match=r"launcher\.peer_copy_every_steps"):
        make_plan(cfg)


def test_a_node_that_cannot_hold_the_peer_copies_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # CPU ranks: 4 copies of a rank's model + optimizer shard and the rank's own
    # training memory, 4 ranks a node; without the copies the plan fits in 8 GB.
    mid = ModelConfig(name="mid", dim=1024, n_layers=8, n_heads=8, n_kv_heads=8, ffn_dim=4096, seq_len=64)
    cfg = _cfg()
    cfg.model, cfg.cluster.mem_per_node_gb = mid, 8.0
    off = copy.deepcopy(cfg)
    off.launcher.in_process_recovery = False
    plan = make_plan(off)
    copy_gb = plan.memory.params_gb + plan.memory.optimizer_gb
    need = 4 * (4 * copy_gb + plan.memory.total_gb)
    assert 4 * plan.memory.total_gb < 8 < need
    with pytest.raises(ConfigError) as e:
        make_plan(cfg)
    msg = str(e.value)
    assert msg.startswith(
        "cluster.mem_per_node_gb=8.0 is invalid: launcher.in_process_recovery=true keeps 4 copies"
    )
    assert f"4 x {copy_gb:.2f} GB a rank" in msg and f"= {need:.1f} GB a node" in msg, msg
    assert f"holds that for 2 rank(s) a node. Set cluster.mem_per_node_gb >= {math.ceil(need)}" in msg, msg
    # Refused by the run's own path, before its run dir is written.
    with pytest.raises(ConfigError, match=r"cluster\.mem_per_node_gb=8\.0 is invalid"):
        prepare(cfg, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    cfg.cluster.mem_per_node_gb = float(math.ceil(need))
    assert make_plan(cfg).world_size == 4  # what the message says fits, fits
    # GPU ranks: the copies alone (an 8B-shaped model on 8 H100s, data parallel).
    gpu = RunConfig(
        cluster=ClusterConfig(gpus_per_node=8, gpu_type="H100", gpu_mem_gb=80, gpu_peak_bf16_tflops=989,
                              mem_per_node_gb=64),
        model=ModelConfig(name="big", dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336,
                          seq_len=4096),
        train=TrainConfig(global_batch_size=8, steps=10),
        parallelism=ParallelismConfig(tp=1, pp=1, cp=1),
    )  # fmt: skip
    gpu.launcher.in_process_recovery = True
    with pytest.raises(ConfigError, match=r"cluster\.mem_per_node_gb=64 is invalid: .*4 x 10\.47 GB a rank, "
                                          r"8 ranks a node = 335\.1 GB a node; .* >= 336"):  # fmt: skip
        make_plan(gpu)


def test_a_world_that_cannot_pair_ranks_is_refused_before_anything_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = _cfg()
    cfg.cluster.local_processes = 1
    with pytest.raises(ConfigError, match=r"launcher\.in_process_recovery=True is invalid: needs at least 2 ranks.*"
                                          r"world size 1.*raise cluster\.local_processes"):  # fmt: skip
        prepare(cfg, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    cfg.cluster.local_processes, cfg.train.global_batch_size = 3, 6  # an odd world pairs as a ring
    assert make_plan(cfg).world_size == 3 and partner_offset(3, 3, 1) == 1


def test_the_store_host_names_a_rank_that_neither_left_nor_arrived() -> None:
    import torch.distributed as dist

    from launcher.run.localrecovery import missing_ranks
    from train.inprocess.missing import missing_after_fault, watch_missing
    from train.inprocess.rendezvous import MISSING_AFTER_KEY, WORLD_KEY

    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    store.set(WORLD_KEY, "4")
    store.set(MISSING_AFTER_KEY, "0.3")
    # Generation 0 broke: ranks 0 and 1 left it, rank 3 is already at generation 1, rank 2 is nowhere.
    store.set("fault/0", "Timed out waiting 5000ms for recv operation to complete")
    for key, rank in (("left/0", 0), ("left/0", 1), ("arrived/1", 3)):
        store.append(key, f"{rank},")
    assert list(missing_after_fault(store, 0)) == [(1, [2])]  # silent: named at the first look
    # Rank 2's watcher answered the fault (alive): named only once the wait is over (stuck).
    store.append("aborted/0", "2,")
    t0 = time.monotonic()
    assert list(missing_after_fault(store, 0)) == [(1, [2])] and time.monotonic() - t0 >= 0.3
    # Generation 1 formed within the wait: nobody is missing.
    store.add("joined/1", 4)
    assert list(missing_after_fault(store, 0)) == []

    def watched(formed_late: int) -> list[str]:
        """What the watch says, from generation 0, while generation
        ``formed_late`` forms a second late; the run then closes it."""
        said: list[str] = []
        watch = threading.Thread(target=watch_missing, args=(store, said.append))
        watch.start()
        time.sleep(1.0)
        store.add(f"joined/{formed_late}", 4)
        store.set(f"fault/{formed_late}", b"closed")
        watch.join(timeout=10)
        assert not watch.is_alive()
        return said

    # The watch: each fault's missing ranks said once; it follows the generations until the run closes one.
    store.set("fault/1", "Timed out waiting 5000ms for recv operation to complete")
    store.append("left/1", "0,1,2,")  # rank 3 hangs at generation 1; generation 2 forms late
    said = watched(2)
    assert said == ["missing 2 3"]  # none of rank 3's processes said it arrived
    assert missing_ranks(said[0] + "\n") == (2, [(3, None)])
    # With the arrival's incarnation (Rendezvous.join writes it): the process that was in the generation.
    store.set("incarnation/2/1", "2")
    store.set("fault/2", "Connection closed by peer")
    store.append("left/2", "0,2,3,")
    said = watched(3)
    assert said == ["missing 3 1:2"], said  # generations 0 and 1 formed: nothing said for them
    assert missing_ranks("missing 3 1:2,0") == (3, [(1, 2), (0, None)])
    for bad in (
        "port 1234",
        "missing 1 2;rm",
        "missing x 2",
        "missing 1 2:",
        "missing 1 2:x",
        "missing 1 :1",
    ):
        assert missing_ranks(bad) is None, bad


def test_a_death_the_launcher_saw_flags_only_the_live_generation_it_was_in() -> None:
    import torch.distributed as dist

    from train.inprocess.missing import flag_dead
    from train.inprocess.rendezvous import GEN_KEY

    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    store.set(GEN_KEY, "0")

    def arrive(gen: int, rank: int, incarnation: int) -> None:  # as Rendezvous.join writes it
        store.set(f"incarnation/{gen}/{rank}", str(incarnation))
        store.append(f"arrived/{gen}", f"{rank},")

    for r in range(4):
        arrive(0, r, 0)
    assert flag_dead(store, 2, 0)  # a member of live generation 0: its fault flagged, the generation moved on
    assert store.get("fault/0").decode() == "rank 2 died (its launcher saw it)" and store.get(GEN_KEY) == b"1"
    assert not flag_dead(store, 3, 0)  # generation 1 is forming; rank 3 is not in it yet: nothing flagged
    assert not store.check(["fault/1"])
    for r in (0, 1, 3):
        arrive(1, r, 0)
    store.set("fault/1", "Connection closed by peer")  # a survivor flagged first
    assert not flag_dead(store, 1, 0) and store.get(GEN_KEY) == b"1"


def test_a_late_word_of_a_death_never_breaks_the_generation_its_replacement_joined() -> None:
    """The launcher's ``dead 2 0`` reaches the store after rank 2's warm
    spare (incarnation 1) arrived at generation 1: generation 1 never held
    the dead process, so it is left to form (by rank alone it was broken,
    and the replacement waited in its group formation for 600 s)."""
    import torch.distributed as dist

    from train.inprocess.missing import flag_dead
    from train.inprocess.rendezvous import GEN_KEY

    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    store.set(GEN_KEY, "1")
    store.set("fault/0", "Connection closed by peer")  # a survivor saw the death first
    for r, inc in ((0, 0), (1, 0), (3, 0), (2, 1)):
        store.set(f"incarnation/1/{r}", str(inc))
        store.append("arrived/1", f"{r},")
    assert not flag_dead(store, 2, 0)
    assert not store.check(["fault/1"]) and store.get(GEN_KEY) == b"1"
    # That replacement dies in generation 1 in its turn: its own word flags it.
    assert flag_dead(store, 2, 1) and store.get(GEN_KEY) == b"2"


def test_a_frozen_swaps_late_error_never_reaches_the_next_generation(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A broken generation's swap whose send times out after the next
    generation formed (its fault froze it) raises nothing there."""
    from train.inprocess import peerstate

    release = threading.Event()

    def swap(blob, dst, src, group, timeout):  # type: ignore[no-untyped-def]
        if group == "old":
            release.wait(5)
            raise RuntimeError("Timed out waiting 5000ms for send operation to complete")
        return b"theirs"

    monkeypatch.setattr(peerstate, "_swap", swap)
    copies = peerstate.PeerCopies(0, 4, 2)
    copies.exchange_async(7, b"mine", "old")
    old = copies._thread
    copies.freeze()  # the fault
    copies.exchange_async(8, b"mine", "new")  # the next generation's first swap
    release.set()
    assert old is not None
    old.join(5)
    copies.wait(threading.Event())  # no error of the old swap
    assert copies.held == {8: b"theirs"} and 7 not in copies.held
    # A swap of the live generation that fails still raises at the next wait.
    monkeypatch.setattr(peerstate, "_swap", lambda *a: (_ for _ in ()).throw(RuntimeError("peer gone")))
    copies.exchange_async(9, b"mine", "new")
    with pytest.raises(RuntimeError, match="peer gone"):
        copies.wait(threading.Event())


def test_the_local_launcher_kills_the_named_process_only_while_it_is_the_ranks_newest() -> None:
    """cluster=local: the store host names (rank, incarnation). The rank's
    newest process named is killed, a replacement that hung after it
    joined too (rank 2, incarnation 1); a dead process whose replacement
    is starting (rank 2, incarnation 0) and a rank none of whose processes
    was in the broken generation (None) are left be."""
    import queue

    from launcher.run.local import _Ranks

    procs = [subprocess.Popen(["sleep", "30"], start_new_session=True) for _ in range(4)]
    hung: list[tuple[int, int]] = []
    missing: queue.Queue = queue.Queue()
    store = SimpleNamespace(missing=missing, note_hung=lambda g, r: hung.append((g, r)))
    ranks = _Ranks(store=store)  # type: ignore[arg-type]
    for p in procs:
        ranks.procs.append(p)
    ranks.incarnations = {2: 1}
    try:
        missing.put((3, [(2, 0), (0, None)]))
        ranks._kill_hung()
        assert hung == [] and all(p.poll() is None for p in procs)
        missing.put((3, [(2, 1), (3, 0)]))
        ranks._kill_hung()
        assert hung == [(3, 2), (3, 3)]
        assert procs[2].wait(timeout=10) == procs[3].wait(timeout=10) == -signal.SIGKILL
        assert procs[0].poll() is None and procs[1].poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()
