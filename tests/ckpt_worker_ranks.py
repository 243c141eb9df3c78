"""One rank of tests/local/test_checkpoint_worker.py (started with RANK /
WORLD_SIZE / MASTER_ADDR / MASTER_PORT): an FSDP2 model and AdamW saved
once through CheckpointManager (its worker process writes it) and once with
a direct DCP save, then both loaded back into fresh sharded models."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from ckpt_drill import build_model  # noqa: E402

from launcher.config.schema import ClusterConfig, RunConfig  # noqa: E402
from launcher.config.spec import RunSpec  # noqa: E402
from launcher.plan.make import make_plan  # noqa: E402
from train.checkpoint import CheckpointManager  # noqa: E402
from train.loop.state import ModelState, OptimState  # noqa: E402
from train.parallel.dist import DistInfo  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    cfg = RunConfig(cluster=ClusterConfig(local_processes=world))
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(out / "run"), run_id="worker-test-0000")
    info = DistInfo(rank, world, rank, world, 0, "cpu", "gloo", "127.0.0.1", int(os.environ["MASTER_PORT"]))

    def state_of(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
        return {"model": ModelState([model]), "optim": OptimState([model], [opt])}

    model = build_model(48, 3, world)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    torch.manual_seed(rank)
    for _ in range(2):
        model(torch.randn(4, 48)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    ckpt = CheckpointManager(spec, info)
    ckpt.save(2, state_of(model, opt))
    report = ckpt.finalize(timeout_s=120)
    assert report["committed_steps"] == [2], report
    direct = out / "direct"
    dcp.save(state_of(model, opt), checkpoint_id=str(direct))

    result: dict = {"worker_pid": ckpt.worker.proc.pid, "trainer_pid": os.getpid()}
    loaded = []
    for path in (Path(ckpt.root) / "step_2", direct):
        m = build_model(48, 3, world)
        o = torch.optim.AdamW(m.parameters(), lr=0.05)
        m(torch.randn(4, 48)).square().mean().backward()
        o.step()  # the optimizer state exists, to be overwritten by the load
        o.zero_grad()
        st = state_of(m, o)
        dcp.load(st, checkpoint_id=str(path))
        loaded.append(st)
    want = state_of(model, opt)
    for name, st in zip(("worker", "direct"), loaded, strict=True):
        same = True
        for key in ("model", "optim"):
            a, b = want[key].state_dict(), st[key].state_dict()
            flat_a = torch.utils._pytree.tree_leaves(a)
            flat_b = torch.utils._pytree.tree_leaves(b)
            for x, y in zip(flat_a, flat_b, strict=True):
                if isinstance(x, torch.Tensor):
                    x = x.full_tensor() if hasattr(x, "full_tensor") else x
                    y = y.full_tensor() if hasattr(y, "full_tensor") else y
                    same &= torch.equal(x, y)
        result[f"{name}_equal"] = bool(same)
    if rank == 0:
        meta_w = dcp.FileSystemReader(str(Path(ckpt.root) / "step_2")).read_metadata()
        meta_d = dcp.FileSystemReader(str(direct)).read_metadata()
        result["same_metadata"] = {
            k: [(c.offsets, c.sizes) for c in getattr(v, "chunks", [])]
            for k, v in meta_w.state_dict_metadata.items()
        } == {
            k: [(c.offsets, c.sizes) for c in getattr(v, "chunks", [])]
            for k, v in meta_d.state_dict_metadata.items()
        }
        result["sharded_keys"] = sum(
            1 for v in meta_w.state_dict_metadata.values() if len(getattr(v, "chunks", [])) == world
        )
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
