"""job=eval: a checkpoint evaluated on the batch the trainer saw next gives
the loss the training loop logged for that batch; every checkpoint of a
finished run is evaluated; eval.json in the run dir.
Tests that start no process: tests/unit/test_jobs_eval_units.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from jobs_util import VOCAB, make_hf_dir, make_run, write_tokens

from launcher.config.compose import compose
from launcher.config.spec import RunSpec
from launcher.plan.make import make_plan
from launcher.run.local import run_local
from launcher.run.rundir import write_run_dir

SEQ, BATCH = 32, 8


def test_eval_of_each_checkpoint_matches_the_logged_loss(tmp_path: Path) -> None:
    tokens = np.random.default_rng(3).integers(0, 256, 40 * SEQ + 1)
    data = write_tokens(tmp_path / "train_tokens", tokens, vocab=256)
    common = [f"model.seq_len={SEQ}", "data.use_dali=false", "data.shuffle=false", "parallelism.mode=fsdp"]
    train = make_run(
        tmp_path / "train",
        [
            *common,
            "data=tokens",
            f"data.path={data}",
            f"train.global_batch_size={BATCH}",
            "train.steps=3",
            "train.log_every_steps=1",
            "storage.save_every_steps=1",
            "storage.keep_local=5",
            "storage.async_save=false",
        ],
    )
    assert run_local(train, echo=None) == 0, (Path(train.run_dir) / "logs/rank0.log").read_text()[-3000:]
    logged = {
        r["step"]: r["loss"]
        for r in map(json.loads, (Path(train.run_dir) / "metrics.jsonl").read_text().splitlines())
        if "event" not in r
    }
    # Held out: exactly the sequences of the trainer's 3rd batch (file order),
    # which step 3 ran on the weights of checkpoint step_2.
    third = tokens[2 * BATCH * SEQ : 3 * BATCH * SEQ + 1]
    held_out = write_tokens(tmp_path / "held_out", third, vocab=256)
    ev = make_run(
        tmp_path / "eval",
        [*common, "job=eval", f"job.checkpoint={train.run_dir}", "data=tokens", f"data.path={held_out}"],
    )
    assert ev.cfg.qos.name == "inference" and ev.plan.global_batch_size == BATCH
    assert run_local(ev, echo=None) == 0, (Path(ev.run_dir) / "logs/rank0.log").read_text()[-3000:]
    doc = json.loads((Path(ev.run_dir) / "eval.json").read_text())
    assert [r["step"] for r in doc["results"]] == [1, 2, 3]
    assert doc["batches"] == 1 and doc["tokens"] == BATCH * SEQ
    by_step = {r["step"]: r for r in doc["results"]}
    assert by_step[2]["loss"] == pytest.approx(logged[3], rel=1e-5, abs=1e-6)
    assert by_step[2]["perplexity"] == pytest.approx(math.exp(logged[3]), rel=1e-5)
    # Other weights give other losses on that batch (the match is not a constant).
    assert abs(by_step[1]["loss"] - by_step[2]["loss"]) > 1e-4
    assert abs(by_step[3]["loss"] - by_step[2]["loss"]) > 1e-4
    result = json.loads((Path(ev.run_dir) / "result.json").read_text())
    assert result["status"] == "completed" and result["final_loss"] == pytest.approx(by_step[3]["loss"])


def test_eval_under_tensor_and_pipeline_parallel_equals_one_process(tmp_path: Path) -> None:
    """The same HF weights and held-out batches: tp=2 and pp=2 (2 gloo ranks
    each) give the single-process loss to 1e-5."""
    hf = make_hf_dir(tmp_path / "hf")
    data = write_tokens(tmp_path / "tokens", np.random.default_rng(4).integers(0, VOCAB, 2 * BATCH * SEQ + 1))
    common = [
        "job=eval",
        "model=hf",
        f"job.hf_path={hf}",
        f"model.seq_len={SEQ}",
        "data=tokens",
        f"data.path={data}",
        "data.use_dali=false",
        f"train.global_batch_size={BATCH}",
    ]
    layouts = {
        "one": ["cluster.local_processes=1"],
        "tp2": ["cluster.local_processes=2", "parallelism.mode=fsdp_tp", "parallelism.tp=2"],
        "pp2": [
            "cluster.local_processes=2",
            "parallelism.mode=fsdp_tp_pp",
            "parallelism.pp=2",
            "parallelism.tp=1",
        ],
    }
    loss = {}
    for name, extra in layouts.items():
        cfg = compose([*common, *extra])
        spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path / name))
        write_run_dir(spec)
        assert (spec.plan.tp, spec.plan.pp) == {"one": (1, 1), "tp2": (2, 1), "pp2": (1, 2)}[name]
        assert run_local(spec, echo=None) == 0, (Path(spec.run_dir) / "logs/rank0.log").read_text()[-3000:]
        doc = json.loads((Path(spec.run_dir) / "eval.json").read_text())
        assert doc["batches"] == 2 and doc["tokens"] == 2 * BATCH * SEQ, doc
        loss[name] = doc["results"][0]["loss"]
    assert 3.0 < loss["one"] < 7.0, loss  # a random model on VOCAB=128 tokens: about ln 128
    assert loss["tp2"] == pytest.approx(loss["one"], rel=1e-5, abs=1e-6), loss
    assert loss["pp2"] == pytest.approx(loss["one"], rel=1e-5, abs=1e-6), loss
