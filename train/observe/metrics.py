"""Prometheus metrics of a training rank: one ``prometheus_client`` exporter per
rank, on ``cluster.metrics_port + local_rank`` (ports never collide between
the ranks of a node; a port already taken, e.g. by a second job on the node,
falls back to a free one, which the targets file records).

Series (labels ``run``, ``job_id``, ``node``, ``rank`` on all of them):
- ``meshrun_step``, ``meshrun_step_time_seconds``, ``meshrun_tokens_per_second``
  (and ``_per_gpu``), ``meshrun_mfu_ratio``, ``meshrun_loss``,
  ``meshrun_learning_rate``, ``meshrun_grad_norm``, ``meshrun_peak_memory_bytes``;
- ``meshrun_data_wait_seconds`` and ``meshrun_data_wait_ratio`` (of the step);
- ``meshrun_collective_seconds{op}`` and ``meshrun_collective_calls{op}`` per
  step, ``op`` in all_reduce / reduce_scatter / all_gather / send_recv /
  broadcast / all_to_all / barrier (see :mod:`train.observe.commsample`);
- ``meshrun_checkpoint_stall_seconds``, ``meshrun_checkpoint_upload_lag_seconds``,
  ``meshrun_checkpoint_step`` (the newest committed step);
  ``meshrun_checkpoint_save_failures_total`` (saves that did not commit, a
  counter) and ``meshrun_checkpoint_failed_saves_in_a_row``;
- per GPU from NVML, only when NVML finds the rank's GPU (absent on CPU
  machines, never faked): ``meshrun_gpu_utilization_ratio``,
  ``meshrun_gpu_memory_used_bytes``, ``meshrun_gpu_memory_total_bytes``,
  ``meshrun_gpu_power_watts``, ``meshrun_gpu_nvlink_bytes_total{direction}``;
- rank 0 only, labels ``run`` and ``job_id``: the run's goodput from
  ``<run_dir>/goodput.json`` as it is refreshed (``meshrun_goodput_gpu_seconds{bucket}``,
  ``meshrun_allocated_gpu_seconds``, ``meshrun_ettr_ratio``, ...: the series
  ``meshrun fleet --prom`` writes, launcher/config/goodputfile.py); the
  supervisor's straggler scores (``<run_dir>/stragglers.json``):
  ``meshrun_straggler_score{straggler_node}``, ``meshrun_straggler_flagged{straggler_node}``.

Cheap when nobody scrapes: ``update`` only sets gauge values; NVML is read in
the scrape handler. Collective times come from a profiler window of one
training step every ``cluster.metrics_comm_sample_every`` updates, read off
the loop thread.

Prometheus finds the exporters through a file_sd targets file per job,
``<run_dir>/prometheus/<job_id>.json`` (point ``file_sd_configs`` at
``<run_dir>/prometheus/*.json``): every rank writes its own fragment, rank 0
merges them into the job file once all are there.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from launcher.config.goodputfile import HELP as GOODPUT_HELP
from launcher.config.goodputfile import SERIES as GOODPUT_SERIES
from launcher.config.goodputfile import samples as goodput_samples
from launcher.config.runfiles import GOODPUT_FILE
from train.observe.commsample import COLLECTIVE_OPS, CollectiveSampler

LABELS = ("run", "job_id", "node", "rank")
TARGETS_DIR = "prometheus"

# metrics.jsonl key -> (series name, help, scale to the series' unit)
STEP_SERIES: dict[str, tuple[str, str, float]] = {
    "step": ("meshrun_step", "Last optimizer step this rank finished", 1.0),
    "step_time_s": ("meshrun_step_time_seconds", "Wall time of the last step", 1.0),
    "tokens_per_s": ("meshrun_tokens_per_second", "Tokens per second, whole job", 1.0),
    "tokens_per_s_per_gpu": ("meshrun_tokens_per_second_per_gpu", "Tokens per second per GPU (rank)", 1.0),
    "mfu": ("meshrun_mfu_ratio", "Model FLOPs utilisation, 0-1", 1.0),
    "loss": ("meshrun_loss", "Training loss of the last step", 1.0),
    "lr": ("meshrun_learning_rate", "Learning rate of the last step", 1.0),
    "grad_norm": ("meshrun_grad_norm", "Gradient norm before clipping", 1.0),
    "data_wait_s": ("meshrun_data_wait_seconds", "Seconds the step waited on the data loader", 1.0),
    "data_wait_pct": ("meshrun_data_wait_ratio", "Share of the step spent waiting on data, 0-1", 0.01),
    "peak_mem_gb": ("meshrun_peak_memory_bytes", "Peak accelerator memory of this rank", 1e9),
    # Checkpoint events (the checkpoint manager's figures).
    "checkpoint_stall_s": (
        "meshrun_checkpoint_stall_seconds",
        "Seconds the loop blocked on the last save",
        1.0,
    ),
    "upload_lag_s": (
        "meshrun_checkpoint_upload_lag_seconds",
        "Seconds from the last save to its verified remote upload",
        1.0,
    ),
    "checkpoint_step": ("meshrun_checkpoint_step", "Step of the newest saved checkpoint", 1.0),
    # storage.save_every_steps (auto: the re-tuned interval, a save_interval event's "steps").
    "save_every_steps": ("meshrun_checkpoint_interval_steps", "Steps between step-based saves", 1.0),
}
# Other spellings the checkpoint event may use for the same figures.
ALIASES = {
    "stall_s": "checkpoint_stall_s",
    "blocked_s": "checkpoint_stall_s",
    "save_blocked_s": "checkpoint_stall_s",
}


def job_id() -> str:
    """The Slurm job id (array jobs: ``<array>_<task>``), or ``local``."""
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID", "local")


def node_name() -> str:
    """Slurm's name for this node (several test-cluster "nodes" share a
    host), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


class NvmlCollector(Collector):
    """Reads the rank's GPU from NVML at scrape time."""

    def __init__(self, pynvml: Any, handle: Any, gpu: str, labels: dict[str, str]) -> None:
        self.nvml, self.handle, self.gpu = pynvml, handle, gpu
        self.names = list(labels) + ["gpu"]
        self.values = list(labels.values()) + [gpu]

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=self.names)
        g.add_metric(self.values, value)
        return g

    def collect(self):  # type: ignore[no-untyped-def]
        nv, h = self.nvml, self.handle
        try:
            util = nv.nvmlDeviceGetUtilizationRates(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            power_mw = nv.nvmlDeviceGetPowerUsage(h)
        except nv.NVMLError:
            return
        yield self._gauge("meshrun_gpu_utilization_ratio", "GPU busy share, 0-1 (NVML)", util.gpu / 100.0)
        yield self._gauge("meshrun_gpu_memory_used_bytes", "GPU memory in use (NVML)", float(mem.used))
        yield self._gauge("meshrun_gpu_memory_total_bytes", "GPU memory size (NVML)", float(mem.total))
        yield self._gauge("meshrun_gpu_power_watts", "GPU power draw (NVML)", power_mw / 1000.0)
        nvlink = self._nvlink_kib()
        if nvlink is not None:
            c = CounterMetricFamily(
                "meshrun_gpu_nvlink_bytes",
                "NVLink data bytes over all links since boot (NVML)",
                labels=self.names + ["direction"],
            )
            c.add_metric([*self.values, "tx"], nvlink[0] * 1024.0)
            c.add_metric([*self.values, "rx"], nvlink[1] * 1024.0)
            yield c

    def _nvlink_kib(self) -> tuple[float, float] | None:
        nv = self.nvml
        all_links = 0xFFFFFFFF  # scopeId UINT_MAX: summed over every link
        try:
            vals = nv.nvmlDeviceGetFieldValues(
                self.handle,
                [
                    (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, all_links),
                    (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, all_links),
                ],
            )
        except (nv.NVMLError, AttributeError):
            return None
        if any(v.nvmlReturn != nv.NVML_SUCCESS for v in vals):
            return None  # no NVLink on this GPU (PCIe cards): no series
        return float(vals[0].value.ullVal), float(vals[1].value.ullVal)


class GoodputCollector(Collector):
    """The run's ``goodput.json`` (refreshed by the batch-level supervisor,
    ``meshrun status`` and ``meshrun fleet``; launcher/config/goodputfile.py)
    at scrape time: rank 0 serves it while the run runs. Re-read only when
    the file changed; nothing is served before the first one is written."""

    def __init__(self, run_dir: Path, labels: dict[str, str]) -> None:
        self.path = run_dir / GOODPUT_FILE
        self.labels = {"run": labels["run"], "job_id": labels["job_id"]}
        self._mtime: float | None = None
        self._g: dict[str, Any] | None = None

    def _read(self) -> dict[str, Any] | None:
        try:
            mtime = self.path.stat().st_mtime
            if mtime != self._mtime:
                self._g, self._mtime = json.loads(self.path.read_text()), mtime
        except (OSError, ValueError):
            return self._g  # being replaced, or not there yet: the last one read
        return self._g

    def collect(self):  # type: ignore[no-untyped-def]
        g = self._read()
        if not g:
            return
        families: dict[str, GaugeMetricFamily] = {}
        for key, extra, value in goodput_samples(g):
            fam = families.get(key)
            if fam is None:
                fam = families[key] = GaugeMetricFamily(
                    GOODPUT_SERIES[key], GOODPUT_HELP[key], labels=[*self.labels, *extra]
                )
            fam.add_metric([*self.labels.values(), *extra.values()], value)
        yield from families.values()


class StragglerCollector(Collector):
    """The supervisor's straggler scores (``<run_dir>/stragglers.json``,
    launcher/selfheal/straggler.py) at scrape time, on rank 0:
    ``meshrun_straggler_score{straggler_node}`` (a node's solo probe time
    over its peers' median) and ``meshrun_straggler_flagged{straggler_node}``."""

    def __init__(self, run_dir: Path, labels: dict[str, str]) -> None:
        from launcher.config.runfiles import STRAGGLERS_FILE

        self.path = run_dir / STRAGGLERS_FILE
        self.labels = {"run": labels["run"], "job_id": labels["job_id"]}

    def collect(self):  # type: ignore[no-untyped-def]
        try:
            nodes = json.loads(self.path.read_text()).get("nodes", {})
        except (OSError, ValueError, AttributeError):
            return  # none yet, or being replaced
        names = [*self.labels, "straggler_node"]
        score = GaugeMetricFamily(
            "meshrun_straggler_score", "Solo probe time over the peers' median", labels=names
        )
        flagged = GaugeMetricFamily("meshrun_straggler_flagged", "1: a straggler by the rule", labels=names)
        for node, v in sorted(nodes.items()):
            score.add_metric([*self.labels.values(), node], float(v.get("score", 0)))
            flagged.add_metric([*self.labels.values(), node], 1.0 if v.get("straggler") else 0.0)
        yield score
        yield flagged


def nvml_gpu(local_rank: int) -> tuple[Any, Any, str] | None:
    """(pynvml module, handle, gpu index label) of this rank's GPU, or None
    when pynvml is not installed or NVML finds no GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        ident = visible[local_rank].strip() if local_rank < len(visible) else str(local_rank)
        if ident.isdigit():
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(ident))
        else:  # CUDA_VISIBLE_DEVICES may list UUIDs
            handle = pynvml.nvmlDeviceGetHandleByUUID(ident)
        return pynvml, handle, str(pynvml.nvmlDeviceGetIndex(handle))
    except (pynvml.NVMLError, IndexError, ValueError):
        return None


def _serve(port: int, addr: str, registry: CollectorRegistry) -> tuple[Any, int]:
    """Start the HTTP exporter on ``port``, or a free port when it is taken."""
    try:
        server, _ = start_http_server(port, addr=addr, registry=registry)
    except OSError:
        server, _ = start_http_server(0, addr=addr, registry=registry)
    return server, server.server_port


class MetricsExporter:
    """One rank's Prometheus exporter. ``update`` takes the same dicts the
    rank-0 metrics.jsonl gets (steps and checkpoint events); call it on every
    rank. ``close`` stops the server."""

    def __init__(self, spec: Any, dist_info: Any, *, comm_sample_every: int | None = None) -> None:
        cluster = spec.cfg.cluster
        self.rank = int(dist_info.rank)
        self.world_size = int(dist_info.world_size)
        self.run_dir = Path(spec.run_dir)
        self.job_id = job_id()
        self.labels = {
            "run": getattr(spec, "run_id", "") or self.run_dir.name,
            "job_id": self.job_id,
            "node": node_name(),
            "rank": str(self.rank),
        }
        self.enabled = cluster.metrics_port > 0
        self.port = 0
        self._server: Any = None
        self._targets_merged = False
        every = cluster.metrics_comm_sample_every if comm_sample_every is None else comm_sample_every
        cuda = str(dist_info.device).startswith("cuda")
        self.sampler = CollectiveSampler(every if self.enabled else 0, cuda)
        if not self.enabled:
            return
        self.registry = CollectorRegistry()
        self._gauges: dict[str, Any] = {}
        for key, (name, doc, _) in STEP_SERIES.items():
            self._gauges[key] = Gauge(name, doc, LABELS, registry=self.registry).labels(**self.labels)
        self._coll_s = Gauge(
            "meshrun_collective_seconds",
            "Seconds per step in collectives, by op (sampled profiler window)",
            (*LABELS, "op"),
            registry=self.registry,
        )
        self._coll_n = Gauge(
            "meshrun_collective_calls",
            "Collective calls per step, by op (sampled profiler window)",
            (*LABELS, "op"),
            registry=self.registry,
        )
        self._save_failures = Counter(
            "meshrun_checkpoint_save_failures",
            "Checkpoint saves that did not commit (staging, write or commit failed, or the worker stalled)",
            LABELS,
            registry=self.registry,
        ).labels(**self.labels)
        self._failed_in_a_row = Gauge(
            "meshrun_checkpoint_failed_saves_in_a_row",
            "Checkpoint saves failed since the last commit (storage.max_failed_saves stops the run)",
            LABELS,
            registry=self.registry,
        ).labels(**self.labels)
        self._record_faults()
        if self.rank == 0:
            self.registry.register(GoodputCollector(self.run_dir, self.labels))
            self.registry.register(StragglerCollector(self.run_dir, self.labels))
        gpu = nvml_gpu(int(dist_info.local_rank)) if cuda else None
        if gpu is not None:
            self.registry.register(NvmlCollector(gpu[0], gpu[1], gpu[2], self.labels))
        # Clusters: listen on every interface so Prometheus can reach it;
        # local runs stay on loopback.
        local = cluster.kind == "local"
        port = cluster.metrics_port + int(dist_info.local_rank)
        self._server, self.port = _serve(port, "127.0.0.1" if local else "0.0.0.0", self.registry)
        self.address = f"127.0.0.1:{self.port}" if local else f"{socket.gethostname()}:{self.port}"
        self._write_fragment()
        self._merge_targets()

    def _record_faults(self) -> None:
        """The run's faults so far (<run_dir>/faults.jsonl, written by the
        batch-level supervisor before this start): counts and seconds lost."""
        from launcher.config.health import fault_summary, read_faults

        s = fault_summary(read_faults(self.run_dir))
        faults = Gauge(
            "meshrun_faults",
            "Faults of this run so far, by cause",
            (*LABELS, "cause"),
            registry=self.registry,
        )
        for cause, n in s["by_cause"].items():
            faults.labels(**self.labels, cause=cause).set(n)
        for name, doc, value in (
            ("meshrun_fault_restarts", "Restarts inside the allocation after faults", s["restarts"]),
            ("meshrun_fault_requeues", "Requeues after faults (no healthy node left)", s["requeues"]),
            (
                "meshrun_fault_seconds_lost",
                "Seconds from faults to the first resumed step, summed",
                s["seconds_lost"],
            ),
            ("meshrun_fault_steps_redone", "Steps trained again after faults", s["steps_redone"]),
        ):
            Gauge(name, doc, LABELS, registry=self.registry).labels(**self.labels).set(value)

    # --- targets (file_sd) -------------------------------------------------
    @property
    def targets_dir(self) -> Path:
        return self.run_dir / TARGETS_DIR

    @property
    def targets_file(self) -> Path:
        """The job's file_sd file (written by rank 0)."""
        return self.targets_dir / f"{self.job_id}.json"

    def _fragment_dir(self) -> Path:
        return self.targets_dir / "ranks" / self.job_id

    def _write_fragment(self) -> None:
        d = self._fragment_dir()
        d.mkdir(parents=True, exist_ok=True)
        entry = {"targets": [self.address], "labels": self.labels}
        tmp = d / f".rank{self.rank}.tmp"
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, d / f"rank{self.rank}.json")

    def _merge_targets(self) -> None:
        """Rank 0: once every rank's fragment exists, write the job file."""
        if self.rank != 0 or self._targets_merged:
            return
        d = self._fragment_dir()
        entries = []
        for r in range(self.world_size):
            try:
                entries.append(json.loads((d / f"rank{r}.json").read_text()))
            except (OSError, ValueError):
                return  # not all ranks are up yet; retried at the next update
        tmp = self.targets_dir / f".{self.job_id}.tmp"
        tmp.write_text(json.dumps(entries, indent=1) + "\n")
        os.replace(tmp, self.targets_file)  # Prometheus never reads half a file
        self._targets_merged = True

    # --- updates -------------------------------------------------------------
    def update(self, step_metrics: dict[str, Any]) -> None:
        """Set the series from one metrics.jsonl-style dict (a step, or an
        ``{"event": "checkpoint", ...}`` line). Unknown keys are ignored."""
        if not self.enabled:
            return
        event = step_metrics.get("event")
        for key, value in step_metrics.items():
            key = ALIASES.get(key, key)
            if event is not None and key == "step":
                continue  # an event's step is not the training progress
            series = STEP_SERIES.get(key)
            if series is None or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            self._gauges[key].set(float(value) * series[2])
        if event == "checkpoint" and isinstance(step_metrics.get("step"), int):
            self._gauges["checkpoint_step"].set(step_metrics["step"])
        if event is None and isinstance(step_metrics.get("step"), int):
            summary = self.sampler.on_update(step_metrics["step"])
            if summary is not None:
                self._set_collectives(summary)
        self._merge_targets()

    def step_begin(self, step: int) -> None:
        """Call before each training step (the collective sampler's window)."""
        if self.enabled:
            self.sampler.step_begin(step)

    def step_end(self, step: int) -> None:
        """Call after each training step, before the stop decision."""
        if self.enabled:
            self.sampler.step_end(step)

    def record_checkpoint(self, *, stall_s: float | None = None, upload_lag_s: float | None = None) -> None:
        """For the checkpoint manager: loop stall of a save, or the lag of
        its upload once verified."""
        d: dict[str, Any] = {}
        if stall_s is not None:
            d["checkpoint_stall_s"] = stall_s
        if upload_lag_s is not None:
            d["upload_lag_s"] = upload_lag_s
        self.update(d)

    def record_save(self, step: int, *, ok: bool, failures_in_a_row: int) -> None:
        """A save's outcome: its commit (the newest committed step), or a
        failure (counted)."""
        if not self.enabled:
            return
        if ok:
            self._gauges["checkpoint_step"].set(step)
        else:
            self._save_failures.inc()
        self._failed_in_a_row.set(failures_in_a_row)

    def _set_collectives(self, summary: dict[str, tuple[float, int]]) -> None:
        # Every op gets a value (0 when the window saw none), so a series
        # never goes stale showing an old figure.
        for op in COLLECTIVE_OPS:
            seconds, calls = summary.get(op, (0.0, 0))
            self._coll_s.labels(**self.labels, op=op).set(seconds)
            self._coll_n.labels(**self.labels, op=op).set(calls)

    def close(self) -> None:
        self.sampler.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def wait_for_targets(
    run_dir: str | os.PathLike[str], job: str, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """The job's targets file once rank 0 wrote it (tests, tools)."""
    path = Path(run_dir) / TARGETS_DIR / f"{job}.json"
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists():
            return json.loads(path.read_text())
        time.sleep(0.1)
    raise TimeoutError(f"no targets file {path} after {timeout_s:.0f} s")
