"""The host-sync watch (train/observe/hostsync.py) and the deferred stop vote
(train/loop/signals.py) on their own; the real trainer under
``train.host_sync_check=raise`` is tests/local/test_train_local.py's default run."""

from __future__ import annotations

import pytest
import torch

from train.loop.signals import PreemptFlag
from train.loop.step import read_scalars
from train.observe.hostsync import HostSyncError, SyncWatch, during, unwatched


@pytest.mark.parametrize(
    "read",
    [
        lambda t: t.item(),
        lambda t: t.tolist(),
        lambda t: t.cpu(),
        lambda t: bool(t),
        lambda t: float(t),
        lambda t: t.numpy(),
    ],
    ids=["item", "tolist", "cpu", "bool", "float", "numpy"],
)
def test_strict_watch_refuses_each_host_read(read) -> None:
    w = SyncWatch(strict=True)
    x = torch.ones(()) * 2
    with during(w, allowed=False), pytest.raises(HostSyncError, match="non-logging step"):
        read(x)
    with during(w, allowed=True):  # a logging step: counted, allowed
        read(x)
    assert w.count == 2


def test_device_work_and_the_optimizer_are_not_syncs() -> None:
    """Queueing work never reads; AdamW's CPU step counters (read in
    torch.optim) are not device values."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    w = SyncWatch(strict=True)
    with during(w, allowed=False):
        for _ in range(2):
            loss = model(torch.randn(3, 4)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        with unwatched():
            loss.item()
    assert w.count == 0
    with during(w, allowed=True):
        assert read_scalars(loss, loss * 2) == [loss.item(), 2 * loss.item()]
    assert w.count == 3  # one stacked read, then the two item() calls


def test_stop_vote_without_a_group_is_the_local_flags() -> None:
    flag = PreemptFlag()
    assert flag.vote((False, True)).result() == (False, False, True)
    flag.set()
    assert flag.vote((False, False)).result() == (True, False, False)
    assert flag.agreed_with(True) == (True, True)


def test_watch_under_compile_refused_naming_both_fields() -> None:
    """torch.compile cannot trace the watch (dynamo: "Attempted to call a
    super() attribute..."): refused at the launcher, not a crash at step 1."""
    from launcher.config.compose import compose
    from launcher.config.validate import ConfigError, validate

    with pytest.raises(
        ConfigError, match=r"train.host_sync_check='count' is invalid: .*parallelism.compile=false"
    ):
        validate(compose(["train.host_sync_check=count", "parallelism.compile=true"]))
    validate(compose(["train.host_sync_check=count"]))
    validate(compose(["parallelism.compile=true"]))
