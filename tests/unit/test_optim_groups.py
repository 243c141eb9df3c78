"""The optimizer's hyperparameters go into a checkpoint as one item
(train/loop/state.py: pack_groups), not DCP's 12 flattened keys a parameter (8,676
items on Llama 3 70B's structure); a checkpoint saved in the flattened form
still loads (OptimState.match_checkpoint, called by the resume path)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from train.checkpoint.resume import match_checkpoint
from train.loop.state import GROUPS_KEY, OptimState, pack_groups, unpack_groups


def trained(
    seed: int, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.95)
) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    decay = [p for n, p in model.named_parameters() if not n.startswith("1.")]
    no_decay = [p for n, p in model.named_parameters() if n.startswith("1.")]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=betas,
    )
    for _ in range(2):
        model(torch.randn(3, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_groups_are_one_item_and_unpack_exactly() -> None:
    model, opt = trained(0)
    flat = OptimState([model], [opt])
    flat.packed = False
    state = flat.state_dict()
    groups = [k for k in state if k.startswith("param_groups.")]
    params = {k[len("param_groups.") :].rsplit(".", 1)[0] for k in groups}
    assert len(params) == 6 and len(groups) >= 6 * 10  # lr, betas, eps, weight_decay, ... a parameter
    packed = pack_groups(state)
    assert GROUPS_KEY in packed and not any(k.startswith("param_groups.") for k in packed)
    assert len(packed) == len(state) - len(groups) + 1
    again = unpack_groups(packed)
    assert again.keys() == state.keys()
    for k in groups:
        assert again[k] == state[k] and type(again[k]) is type(state[k]), k


def test_checkpoint_in_the_flattened_form_still_loads(tmp_path: Path) -> None:
    model, opt = trained(0)
    old = OptimState([model], [opt])
    old.packed = False  # as saved before the groups were packed
    dcp.save({"optim": old}, checkpoint_id=str(tmp_path / "old"), no_dist=True)
    dcp.save({"optim": OptimState([model], [opt])}, checkpoint_id=str(tmp_path / "new"), no_dist=True)
    for form in ("old", "new"):
        model2, opt2 = trained(1, lr=5e-3, betas=(0.8, 0.9))  # the checkpoint's must replace these
        states = {"optim": OptimState([model2], [opt2])}
        match_checkpoint(states, dcp.FileSystemReader(str(tmp_path / form)).read_metadata())
        assert states["optim"].packed is (form == "new")
        dcp.load(states, checkpoint_id=str(tmp_path / form), no_dist=True)
        assert states["optim"].packed  # the next save packs
        assert [g["weight_decay"] for g in opt2.param_groups] == [0.1, 0.0]
        assert [(g["lr"], g["betas"]) for g in opt2.param_groups] == [(1e-3, (0.9, 0.95))] * 2
        for p, q in zip(model.parameters(), model2.parameters(), strict=True):
            s, t = opt.state[p], opt2.state[q]
            assert torch.equal(s["exp_avg"], t["exp_avg"]) and torch.equal(s["exp_avg_sq"], t["exp_avg_sq"])
