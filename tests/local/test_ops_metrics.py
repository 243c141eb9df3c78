"""Metrics exporter: unit checks, and a real Prometheus server scraping the
exporters of a 2-rank FSDP2 (gloo) job."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness import free_port

from launcher.config.runid import read_run_id
from launcher.config.schema import ClusterConfig
from train.observe.commsample import COLLECTIVE_OPS, classify_collective, summarize_collectives
from train.observe.metrics import MetricsExporter, wait_for_targets

ROOT = Path(__file__).resolve().parents[2]


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        return r.read().decode()


def series(text: str, name: str) -> list[tuple[str, float]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            out.append((labels, float(value)))
    return out


def fake_spec(tmp_path: Path, **cluster: object) -> SimpleNamespace:
    c = ClusterConfig(**cluster)  # type: ignore[arg-type]
    return SimpleNamespace(cfg=SimpleNamespace(cluster=c), run_dir=str(tmp_path / "run1"))


def info(rank: int = 0, local_rank: int = 0, world: int = 1) -> SimpleNamespace:
    return SimpleNamespace(rank=rank, local_rank=local_rank, world_size=world, device="cpu")


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("gloo:all_reduce", "all_reduce"),
        ("gloo:all_gather", "all_gather"),
        ("gloo:reduce_scatter", "reduce_scatter"),
        ("gloo:send", "send_recv"),
        ("gloo:broadcast", "broadcast"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_reduce"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t", "all_gather"),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "send_recv"),
        ("c10d::allreduce_", None),  # enqueue only, not the collective's time
        ("nccl:all_reduce", None),
        ("aten::mm", None),
    ],
)
def test_classify_collective(name: str, op: str | None) -> None:
    assert classify_collective(name) == op


def test_summarize_collectives_sums_by_op() -> None:
    got = summarize_collectives(
        [
            ("gloo:all_reduce", 1500.0),
            ("gloo:all_reduce", 500.0),
            ("gloo:all_gather", 250.0),
            ("aten::add", 9e9),
        ]
    )
    assert got == {"all_reduce": (0.002, 2), "all_gather": (0.00025, 1)}


def test_collective_sampler_profiles_one_step_and_caps_its_trace(tmp_path: Path) -> None:
    """The sampler's cost is bounded by construction: with a log interval of
    5 steps the profiler is on during exactly one step per window (never the
    whole interval), the trace is read by another thread, and the reader
    looks at no more than ``max_events`` events."""
    import threading

    import torch
    import torch.autograd.profiler as autograd_profiler
    import torch.distributed as dist

    from train.observe.commsample import CollectiveSampler

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        sampler = CollectiveSampler(every=1, cuda=False)
        capped = CollectiveSampler(every=1, cuda=False, max_events=20)
        readers: set[str] = set()
        profiled, summaries = [], []
        for step in range(1, 21):
            for s in (sampler, capped):
                s.wait_read()  # one window per sampler; readers never overlap the other's
            sampler.step_begin(step)
            if autograd_profiler._is_profiler_enabled:
                profiled.append(step)
            x = torch.ones(256)
            for _ in range(3):
                dist.all_reduce(x)
            sampler.step_end(step)
            if sampler._reader is not None:
                readers.add(sampler._reader.name)
            capped.step_begin(step)
            for _ in range(50):
                x = x + 1  # > 20 events in the step
            capped.step_end(step)
            if step % 5 == 0:  # a metrics update every log interval
                sampler.wait_read()
                summaries.append(sampler.on_update(step))
                capped.wait_read()
                capped.on_update(step)
        # Updates 2, 3, 4 (steps 10, 15, 20) armed a window: the next step
        # only (step 21 is never run).
        assert profiled == [11, 16], profiled
        assert list(sampler.windows) == [(11, 11), (16, 16)]
        assert not autograd_profiler._is_profiler_enabled
        assert readers == {"meshrun-comm-sample"} and threading.current_thread().name not in readers
        # Per-step figures of that one step: 3 all-reduces.
        assert summaries[2] is not None and summaries[2]["all_reduce"][1] == 3, summaries
        assert sampler.last_events_read < sampler.max_events and not sampler.last_truncated
        assert capped.last_events_read == 20 and capped.last_truncated
    finally:
        dist.destroy_process_group()


def test_update_sets_series_with_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    exp = MetricsExporter(fake_spec(tmp_path, metrics_port=free_port()), info(), comm_sample_every=0)
    try:
        exp.update({"step": 3, "loss": 2.5, "step_time_s": 0.5, "data_wait_pct": 20.0, "peak_mem_gb": 1.5})
        exp.update({"event": "checkpoint", "step": 3, "stall_s": 0.25, "upload_lag_s": 4.0})
        exp.update({"event": "resume", "step": 1})  # must not move meshrun_step back
        text = scrape(exp.address)
        labels = 'job_id="4242",node="node7",rank="0",run="run1"'
        assert f"meshrun_step{{{labels}}} 3.0" in text
        assert f"meshrun_loss{{{labels}}} 2.5" in text
        assert f"meshrun_data_wait_ratio{{{labels}}} 0.2" in text
        assert f"meshrun_peak_memory_bytes{{{labels}}} 1.5e+09" in text
        assert f"meshrun_checkpoint_stall_seconds{{{labels}}} 0.25" in text
        assert f"meshrun_checkpoint_upload_lag_seconds{{{labels}}} 4.0" in text
        assert f"meshrun_checkpoint_step{{{labels}}} 3.0" in text
        # No GPU here: NVML series are absent, not zero.
        assert "meshrun_gpu_" not in text
        # Single rank: rank 0 wrote the job's file_sd file at once.
        targets = json.loads((tmp_path / "run1" / "prometheus" / "4242.json").read_text())
        assert targets == [{"targets": [exp.address], "labels": exp.labels}]
    finally:
        exp.close()


def test_failed_saves_are_counted(tmp_path: Path) -> None:
    exp = MetricsExporter(fake_spec(tmp_path, metrics_port=free_port()), info(), comm_sample_every=0)
    try:
        exp.record_save(4, ok=True, failures_in_a_row=0)
        exp.record_save(8, ok=False, failures_in_a_row=1)
        exp.record_save(12, ok=False, failures_in_a_row=2)
        text = scrape(exp.address)
        labels = 'job_id="local",node="' + exp.labels["node"] + '",rank="0",run="run1"'
        assert f"meshrun_checkpoint_save_failures_total{{{labels}}} 2.0" in text, text
        assert f"meshrun_checkpoint_failed_saves_in_a_row{{{labels}}} 2.0" in text
        # The newest committed step, not the newest attempted one.
        assert f"meshrun_checkpoint_step{{{labels}}} 4.0" in text
    finally:
        exp.close()


def test_rank0_serves_the_runs_goodput_as_it_is_refreshed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launcher.views import goodput as gp

    monkeypatch.setenv("SLURM_JOB_ID", "77")
    spec = fake_spec(tmp_path, metrics_port=free_port())
    (tmp_path / "run1").mkdir()
    exp = MetricsExporter(spec, info(), comm_sample_every=0)
    other = MetricsExporter(
        fake_spec(tmp_path, metrics_port=free_port()), info(rank=1, world=2), comm_sample_every=0
    )
    try:
        assert "meshrun_ettr_ratio" not in scrape(exp.address)  # none written yet: nothing served
        g = {
            "job_id": "77",
            "buckets_gpu_s": {b: 0.0 for b in gp.BUCKETS} | {"startup": 10.0, "productive": 30.0},
            "allocated_gpu_s": 40.0,
            "queue_wait_s": 5.0,
            "steps": {"redone": 2},
            "restarts": 1,
            "ettr": 0.75,
        }
        gp.write(tmp_path / "run1", g)
        text = scrape(exp.address)
        assert 'meshrun_goodput_gpu_seconds{bucket="productive",job_id="77",run="run1"} 30.0' in text, text
        assert 'meshrun_allocated_gpu_seconds{job_id="77",run="run1"} 40.0' in text
        assert 'meshrun_ettr_ratio{job_id="77",run="run1"} 0.75' in text
        assert 'meshrun_redone_steps{job_id="77",run="run1"} 2.0' in text
        # Refreshed (a new file replaces it): the next scrape has the new figures.
        time.sleep(0.01)
        gp.write(tmp_path / "run1", g | {"allocated_gpu_s": 50.0, "ettr": 0.6})
        text = scrape(exp.address)
        assert 'meshrun_allocated_gpu_seconds{job_id="77",run="run1"} 50.0' in text
        assert 'meshrun_ettr_ratio{job_id="77",run="run1"} 0.6' in text
        assert "meshrun_ettr_ratio" not in scrape(other.address)  # rank 0 only: no double count
    finally:
        exp.close()
        other.close()


def test_ports_do_not_collide(tmp_path: Path) -> None:
    base = free_port()
    spec = fake_spec(tmp_path, metrics_port=base)
    a = MetricsExporter(spec, info(0, 0, 3), comm_sample_every=0)
    b = MetricsExporter(spec, info(1, 1, 3), comm_sample_every=0)
    c = MetricsExporter(spec, info(2, 0, 3), comm_sample_every=0)  # same local rank as a: port taken
    try:
        assert a.port == base
        assert len({a.port, b.port, c.port}) == 3
        # The job file lists all three once rank 0 sees every fragment.
        a.update({"step": 1})
        entries = wait_for_targets(spec.run_dir, "local", timeout_s=5)
        assert sorted(e["targets"][0] for e in entries) == sorted(x.address for x in (a, b, c))
        assert [e["labels"]["rank"] for e in entries] == ["0", "1", "2"]
    finally:
        for x in (a, b, c):
            x.close()


def test_disabled_with_port_zero(tmp_path: Path) -> None:
    exp = MetricsExporter(fake_spec(tmp_path, metrics_port=0), info())
    exp.update({"step": 1, "loss": 1.0})
    exp.close()
    assert not (tmp_path / "run1" / "prometheus").exists()


def _prometheus_config(path: Path, run_dir: Path) -> None:
    path.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: meshrun\n    file_sd_configs:\n"
        f"      - files: ['{run_dir}/prometheus/*.json']\n        refresh_interval: 1s\n"
    )


def _query(prom: str, q: str) -> list[dict]:
    url = f"http://{prom}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def _targets(prom: str) -> list[dict]:
    """Prometheus's scrape targets: each one's labels, health and last error."""
    with urllib.request.urlopen(f"http://{prom}/api/v1/targets", timeout=10) as r:
        active = json.loads(r.read())["data"]["activeTargets"]
    return [
        {"rank": t["labels"].get("rank"), "health": t["health"], "error": t.get("lastError")} for t in active
    ]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus package is not installed")
def test_prometheus_scrapes_a_training_job(tmp_path: Path) -> None:
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec, save_spec
    from launcher.plan.make import make_plan

    run = tmp_path / "promrun"
    cfg = compose([f"cluster.metrics_port={free_port()}"])
    save_spec(RunSpec(cfg, make_plan(cfg), str(run)))
    master = free_port()
    env0 = dict(os.environ, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    env0.update(MASTER_PORT=str(master), OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    env0.pop("SLURM_JOB_ID", None)
    ranks = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "ops_metrics_worker.py"), str(run), "12"],
            env=dict(env0, RANK=str(r), LOCAL_RANK=str(r)),
            cwd=ROOT,
            stdout=open(tmp_path / f"rank{r}.log", "w"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    prom_port = free_port()
    cfg_path = tmp_path / "prometheus.yml"
    _prometheus_config(cfg_path, run)
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={cfg_path}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    addr = f"127.0.0.1:{prom_port}"
    try:
        wait_for_targets(run, "local", timeout_s=90)
        # Wait until Prometheus has scraped both ranks after their last step
        # and a collective window.
        deadline = time.monotonic() + 90
        result: list[dict] = []
        while time.monotonic() < deadline:
            try:
                result = _query(addr, 'meshrun_step{job_id="local"} == 12')
                coll = _query(addr, 'meshrun_collective_seconds{op="all_gather"} > 0')
                if len(result) == 2 and len(coll) == 2:
                    break
            except OSError:
                pass
            time.sleep(1)
        assert len(result) == 2, f"Prometheus did not scrape step 12 from both ranks: {result}"
        for r in result:
            m = r["metric"]
            assert m["job"] == "meshrun" and m["run"] == read_run_id(run) and m["job_id"] == "local"
            assert m["node"] == socket.gethostname()
        assert sorted(r["metric"]["rank"] for r in result) == ["0", "1"]

        def values(q: str) -> list[float]:
            return [float(r["value"][1]) for r in _query(addr, q)]

        assert all(0 < v < 30 for v in values("meshrun_step_time_seconds"))
        assert all(v > 100 for v in values("meshrun_tokens_per_second"))
        loss = values("meshrun_loss")
        assert len(loss) == 2 and loss[0] == loss[1] and 0 < loss[0] < 10  # same global loss on each rank
        assert all(0 <= v <= 1 for v in values("meshrun_data_wait_ratio"))
        assert values("meshrun_checkpoint_stall_seconds") == [0.05, 0.05]
        # FSDP2 all-gathers parameters (4 blocks, forward + backward) and
        # reduces gradients: a real, measured time for each rank.
        calls = values('meshrun_collective_calls{op="all_gather"}')
        assert calls == [8.0, 8.0], calls
        assert all(0 < v < 30 for v in values('meshrun_collective_seconds{op="all_reduce"}'))
        ops = {r["metric"]["op"] for r in _query(addr, "meshrun_collective_seconds")}
        assert ops == set(COLLECTIVE_OPS)
        assert _query(addr, "meshrun_gpu_utilization_ratio") == []  # no GPU: absent
    finally:
        (run / "stop").touch()
        for p in ranks:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        prom.terminate()
        prom.wait(timeout=30)
    for r, p in enumerate(ranks):
        assert p.returncode == 0, (tmp_path / f"rank{r}.log").read_text()[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus package is not installed")
def test_prometheus_scrapes_a_launcher_run(tmp_path: Path) -> None:
    """`python -m launcher` (local, 2 gloo ranks, the trainer's own loop):
    Prometheus, pointed at the run's file_sd directory before it starts,
    scrapes both ranks while they train."""
    run = tmp_path / "lrun"
    prom_port = free_port()
    cfg_path = tmp_path / "prometheus.yml"
    _prometheus_config(cfg_path, run)
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={cfg_path}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    addr = f"127.0.0.1:{prom_port}"
    try:
        env = dict(os.environ, TMPDIR=str(tmp_path))
        env.pop("SLURM_JOB_ID", None)
        # Prometheus hands new file_sd targets to its scrapers at most every
        # 5 s, then spreads their first scrapes over the interval: a short run
        # can end between one rank's first scrape and the other's. The run is
        # long enough for both, and the test watches the scrapes while it runs.
        run_p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "launcher",
                f"launcher.run_dir={run}",
                "train.steps=160",
                "train.log_every_steps=2",
                f"cluster.metrics_port={free_port()}",
                "cluster.metrics_comm_sample_every=3",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        seen_while_running: set[str] = set()
        while run_p.poll() is None and seen_while_running != {"0", "1"}:
            with contextlib.suppress(OSError):  # Prometheus still starting
                seen_while_running = {r["metric"]["rank"] for r in _query(addr, "meshrun_step")}
            time.sleep(0.5)
        out, _ = run_p.communicate(timeout=240)
        assert run_p.returncode == 0, out[-3000:]
        targets = _targets(addr)
        assert seen_while_running == {"0", "1"}, (seen_while_running, targets)
        got = _query(addr, "last_over_time(meshrun_step[10m])")
        assert sorted(r["metric"]["rank"] for r in got) == ["0", "1"], (got, targets)
        assert all(r["metric"]["run"] == read_run_id(run) and r["metric"]["job_id"] == "local" for r in got)
        assert all(0 < float(r["value"][1]) <= 160 for r in got)
        loss = _query(addr, "last_over_time(meshrun_loss[10m])")
        assert loss and all(0 < float(r["value"][1]) < 20 for r in loss)
        coll = _query(addr, "max_over_time(meshrun_collective_seconds[10m]) > 0")
        assert {r["metric"]["rank"] for r in coll} == {"0", "1"}, coll
        # Saves every 20 steps: the loop's stall per save reaches Prometheus.
        stall = _query(addr, "max_over_time(meshrun_checkpoint_stall_seconds[10m]) > 0")
        assert {r["metric"]["rank"] for r in stall} == {"0", "1"}, stall
        assert all(float(r["value"][1]) < 30 for r in stall)
    finally:
        prom.terminate()
        prom.wait(timeout=30)
