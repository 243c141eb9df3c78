"""Token loader: sharding across data-parallel ranks, resume, DALI vs the
torch fallback, and bad inputs. Shards are generated here with
scripts/prepare_tokens.py.
Tests that start no process: tests/unit/test_data_tokens_units.py."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from launcher.config.schema import RunConfig
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan
from train.data import build_loader, dp_coords
from train.data.dali_backend import check_dali
from train.parallel.dist import DistInfo

ROOT = Path(__file__).resolve().parents[2]
HAVE_DALI = check_dali() == ""
BACKENDS = [
    pytest.param(True, id="dali", marks=pytest.mark.skipif(not HAVE_DALI, reason=check_dali())),
    False,
]
SEQ = 16


def make_spec(
    path, *, ranks=2, tp=0, pp=0, use_dali=True, gbs=8, seq_len=SEQ, shuffle=True, seed=1234
) -> RunSpec:
    cfg = RunConfig()
    cfg.cluster.local_processes = ranks
    cfg.parallelism.tp, cfg.parallelism.pp = tp, pp
    cfg.model.seq_len = seq_len
    cfg.train.global_batch_size, cfg.train.seed = gbs, seed
    cfg.data.kind, cfg.data.name, cfg.data.path = "tokens", "tokens", str(path)
    cfg.data.use_dali, cfg.data.shuffle, cfg.data.num_workers = use_dali, shuffle, 0
    return RunSpec(cfg, make_plan(cfg), str(path))


def info(rank: int, world: int) -> DistInfo:
    return DistInfo(rank, world, rank, world, 0, "cpu", "gloo", "127.0.0.1", 0)


def loader(spec: RunSpec, rank: int = 0):
    return build_loader(spec, info(rank, spec.plan.world_size))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, str]:
    """Four text files -> byte-level shards of about 3000 tokens."""
    base = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    texts = []
    for i in range(4):
        text = "".join(chr(c) for c in rng.integers(97, 123, 2500 + 300 * i)) + "\n"
        (base / f"doc{i}.txt").write_text(text)
        texts.append(text)
    out = base / "shards"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/prepare_tokens.py"),
            str(base),
            "--out",
            str(out),
            "--shard-tokens",
            "3000",
        ],
        check=True,
        capture_output=True,
    )
    return out, "".join(texts)


def test_prepare_tokens_round_trip(corpus):
    out, text = corpus
    index = json.loads((out / "index.json").read_text())
    assert index["dtype"] == "uint16" and index["vocab_size"] == 256
    assert len(index["shards"]) >= 3
    # The remainder joins the last shard: no shard shorter than shard_tokens.
    assert all(s["num_tokens"] >= 3000 for s in index["shards"])
    tokens = np.concatenate([np.fromfile(out / s["file"], dtype="<u2") for s in index["shards"]])
    assert bytes(tokens.astype(np.uint8)).decode() == text


def windows_of(spec: RunSpec, rank: int, n: int) -> list[np.ndarray]:
    it = loader(spec, rank)
    out = []
    for _ in range(n):
        x, y = next(it)
        assert x.shape == y.shape == (spec.plan.global_batch_size // spec.plan.dp, SEQ)
        assert (x[:, 1:] == y[:, :-1]).all()  # targets are inputs shifted by one
        out.append(np.concatenate([x.numpy(), y[:, -1:].numpy()], axis=1))
    return out


@pytest.mark.parametrize("use_dali", BACKENDS)
@pytest.mark.parametrize("ranks", [2, 4])
def test_disjoint_complete_coverage(corpus, ranks, use_dali):
    out, _ = corpus
    spec = make_spec(out, ranks=ranks, use_dali=use_dali)
    probe = loader(spec)
    bpe, n_windows = probe.order.batches_per_epoch, probe.order.num_samples
    seen = [np.concatenate(windows_of(spec, r, bpe)) for r in range(ranks)]
    # Every window is unique text (random letters), so rows identify samples.
    rows = [tuple(row) for part in seen for row in part]
    assert len(rows) == len(set(rows)) == bpe * spec.plan.global_batch_size
    # Complete: all windows but the dropped tail that cannot fill a global batch.
    assert n_windows - len(rows) < spec.plan.global_batch_size
    all_windows = {tuple(probe.source.shards.window(i).astype(np.int64)) for i in range(n_windows)}
    assert set(rows) <= all_windows


def test_tp_and_pp_peers_get_identical_batches(corpus):
    out, _ = corpus
    spec = make_spec(out, ranks=8, tp=2, pp=2)  # mesh pp2 x dp2 x tp2
    assert (spec.plan.pp, spec.plan.dp, spec.plan.tp) == (2, 2, 2)
    batches = {r: windows_of(spec, r, 3) for r in range(8)}
    groups: dict[int, list[int]] = {}
    for r in range(8):
        groups.setdefault(dp_coords(r, spec.plan)[0], []).append(r)
    assert groups == {0: [0, 1, 4, 5], 1: [2, 3, 6, 7]}
    for members in groups.values():
        for r in members[1:]:
            assert all((a == b).all() for a, b in zip(batches[members[0]], batches[r], strict=True))
    assert not (batches[0][0] == batches[2][0]).all()


@pytest.mark.parametrize("use_dali", BACKENDS)
def test_resume_mid_epoch_continues_the_sequence(corpus, use_dali):
    out, _ = corpus
    spec = make_spec(out, use_dali=use_dali)
    bpe = loader(spec).order.batches_per_epoch
    total = bpe + 5  # crosses an epoch boundary
    straight = windows_of(spec, 1, total)
    first = loader(spec, 1)
    head = [next(first) for _ in range(bpe - 3)]
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    resumed = loader(spec, 1)
    resumed.load_state_dict(state)
    tail = [next(resumed) for _ in range(total - len(head))]
    got = [np.concatenate([x.numpy(), y[:, -1:].numpy()], axis=1) for x, y in head + tail]
    assert all((a == b).all() for a, b in zip(got, straight, strict=True))
    assert resumed.state_dict()["epoch"] == 1
    # A new epoch is a new permutation.
    assert not (straight[0] == straight[bpe]).all()


def test_dali_and_fallback_yield_the_same_windows(corpus):
    if not HAVE_DALI:
        pytest.skip(check_dali())
    out, _ = corpus
    a = windows_of(make_spec(out, use_dali=True), 1, 12)
    b = windows_of(make_spec(out, use_dali=False), 1, 12)
    assert all((x == y).all() for x, y in zip(a, b, strict=True))


def test_resume_refuses_a_different_dataset_or_batch(corpus):
    out, _ = corpus
    state = loader(make_spec(out)).state_dict()
    with pytest.raises(ConfigError, match="global_batch"):
        loader(make_spec(out, gbs=16)).load_state_dict(state)
    with pytest.raises(ConfigError, match="seed"):
        loader(make_spec(out, seed=7)).load_state_dict(state)


def test_wait_is_measured(corpus):
    out, _ = corpus
    it = loader(make_spec(out))
    next(it)
    assert 0.0 < it.last_wait_s < 10.0


def _copy_shards(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_bad_inputs_fail_before_training(corpus, tmp_path):
    out, _ = corpus
    with pytest.raises(ConfigError, match="not a directory"):
        loader(make_spec(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no index.json"):
        loader(make_spec(tmp_path / "empty"))
    odd = _copy_shards(out, tmp_path / "odd")
    with open(odd / "shard_00001.bin", "ab") as f:
        f.write(b"\x00")
    with pytest.raises(ConfigError, match="not a whole number of uint16 tokens"):
        loader(make_spec(odd))
    with pytest.raises(ConfigError, match="model.seq_len=4096.*fewer than one window"):
        loader(make_spec(out, seq_len=4096))
    wide = _copy_shards(out, tmp_path / "wide")
    index = json.loads((wide / "index.json").read_text())
    index["vocab_size"] = 50000
    (wide / "index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match="model.vocab_size=256"):
        loader(make_spec(wide))


def test_without_dali_falls_back_with_one_warning(corpus, monkeypatch, caplog):
    out, _ = corpus
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # import fails as if not installed
    with caplog.at_level(logging.WARNING, logger="meshrun.data"):
        loaders = [loader(make_spec(out), rank) for rank in range(2)]
    assert [it.backend for it in loaders] == ["torch", "torch"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "DALI is not installed" in warnings[0] and "fallback" in warnings[0]
    assert next(loaders[0])[0].shape == (4, SEQ)


def test_prepare_tokens_with_a_local_tokenizer_file(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    text = "the cat sat on the mat. " * 200
    (tmp_path / "doc.txt").write_text(text)
    tok = tokenizers.Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([text], trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    out = tmp_path / "shards"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/prepare_tokens.py"),
            str(tmp_path / "doc.txt"),
            "--out",
            str(out),
        ]
        + ["--tokenizer", str(tmp_path / "tokenizer.json")],
        check=True,
        capture_output=True,
    )
    index = json.loads((out / "index.json").read_text())
    assert index["vocab_size"] == tok.get_vocab_size() and index["tokenizer"] == "tokenizer.json"
    ids = np.fromfile(out / index["shards"][0]["file"], dtype="<u2")
    assert ids[-1] == tok.token_to_id("</s>")  # end of document appended
    assert tok.decode(ids[:6].tolist()) == "the cat sat on the mat"
    batch = next(loader(make_spec(out, seq_len=8)))[0]
    assert batch.shape == (4, 8) and int(batch.max()) < index["vocab_size"]


def test_check_data_is_torch_free(corpus, tmp_path):
    out, _ = corpus
    code = (
        "import sys; from launcher.config.schema import RunConfig; from train.data import check_data\n"
        f"c = RunConfig(); c.model.seq_len = {SEQ}; c.data.kind = 'tokens'; c.data.path = {str(out)!r}\n"
        "print(check_data(c), 'torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    n, torch_loaded = proc.stdout.split()
    assert int(n) == loader(make_spec(out)).order.num_samples and torch_loaded == "False"
