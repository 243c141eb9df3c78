"""Goodput arithmetic on a hand-made timeline, the runs-root walk, the
textfile format and ``meshrun fleet``'s refusals (no Slurm needed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.views import fleetrows as fleet
from launcher.views import fleettext
from launcher.views.goodput import BUCKETS, Attempt, compute, prom_text

ROOT = Path(__file__).resolve().parents[2]


def step(n: int, t: float, dt: float = 1.0) -> dict:
    return {"step": n, "loss": 1.0, "step_time_s": dt, "tokens_per_s": 10.0, "time": t}


def test_goodput_buckets_of_a_preempted_then_resumed_run(tmp_path: Path) -> None:
    """Allocation 1 [100, 140] on 4 GPUs: start-up 10 s, steps 1..20 (1 s
    each, a 2 s save after step 10), preempted at step 20 with no save,
    stops at 140. Allocation 2 [150, 200] (10 s queued): start-up 5 s,
    restore 3 s, start-up 2 s, steps 11..30 redo 11..20, 5 s idle at end."""
    recs = [step(n, 110 + n) for n in range(1, 11)]
    recs.append({"event": "checkpoint", "step": 10, "save_s": 2.0, "time": 122.0})
    recs += [step(n, 112 + n) for n in range(11, 21)]
    recs.append({"event": "preempted", "step": 20, "time": 136.0})
    recs.append({"event": "resume", "step": 10, "restore_s": 3.0, "time": 158.0})
    recs += [step(n, 150 + n) for n in range(11, 31)]  # step 11 ends at 161 (began 160)
    recs.append({"event": "checkpoint", "step": 30, "save_s": 1.0, "time": 181.0})
    atts = [
        Attempt("7", "REQUEUED", 95.0, 100.0, 140.0, 1, 4),
        Attempt("7", "COMPLETED", 140.0, 150.0, 200.0, 1, 4),
    ]
    g = compute(tmp_path, atts, now=1000.0, records=recs)
    s = g["buckets_s"]
    assert s["startup"] == pytest.approx(10 + 5 + 2)
    assert s["restore"] == pytest.approx(3)
    assert s["checkpoint_stall"] == pytest.approx(3)
    assert s["redone"] == pytest.approx(10)  # steps 11..20 again, 1 s each
    assert s["productive"] == pytest.approx(20 + 10)  # 1..20, then 21..30
    assert s["hang_restart"] == pytest.approx(140 - 132)  # last progress 132 (step 20) to the kill
    assert s["idle_end"] == pytest.approx(200 - 181)
    assert sum(s.values()) == pytest.approx(90) and g["allocated_s"] == 90
    assert g["allocated_gpu_s"] == 360 and sum(g["buckets_gpu_s"].values()) == pytest.approx(360)
    assert g["queue_wait_s"] == pytest.approx(5 + 10)
    assert g["steps"] == {"reached": 30, "productive": 30, "redone": 10}
    assert g["ettr"] == pytest.approx(30 / 90)
    assert g["final"] is True and g["restarts"] == 1
    assert set(s) == set(BUCKETS)


def test_goodput_of_a_restart_inside_the_allocation(tmp_path: Path) -> None:
    """One allocation [0, 100] (the supervisor restarts the training in it):
    start 1 runs steps 1..10 (a 1 s save after step 5) and dies at t=20;
    start 2 restores step 5 (38..40), redoes 6..10 and runs to 20 (t=55)."""
    recs = [step(n, 9 + n) for n in range(1, 6)]
    recs.append({"event": "checkpoint", "step": 5, "save_s": 1.0, "time": 15.0})
    recs += [step(n, 10 + n) for n in range(6, 11)]
    recs.append({"event": "resume", "step": 5, "restore_s": 2.0, "time": 40.0})
    recs += [step(n, 35 + n) for n in range(6, 21)]
    g = compute(tmp_path, [Attempt("5", "COMPLETED", 0.0, 0.0, 100.0, 1, 4)], now=200.0, records=recs)
    s = g["buckets_s"]
    assert s == pytest.approx(
        {"startup": 9, "restore": 2, "productive": 20, "checkpoint_stall": 1, "redone": 5, "hang_restart": 18,
         "recovery": 0, "idle_end": 45, "degraded": 0}
    )  # fmt: skip
    assert g["steps"] == {"reached": 20, "productive": 20, "redone": 5}
    assert g["allocated_gpu_s"] == 400 and g["ettr"] == pytest.approx(0.2)
    assert g["restarts"] == 1  # the restart inside the allocation counts (it is no requeue)


def test_goodput_of_in_process_recoveries(tmp_path: Path) -> None:
    """One allocation [0, 60] on 4 GPUs: steps 1..10 (t=11..20), a rank dies
    at t=20.5 (step 11 in flight); the survivors roll back to step 9 (the
    marker at t=22), step 10 redone (begins 23.5), 11..15 (t=25..29); a
    second fault at t=29.5 with no rollback, steps 16..20 from t=31 (to 36)."""
    recs = [step(n, 10 + n) for n in range(1, 11)]
    recs.append({"event": "in_process_resume", "step": 9, "fault_time": 20.5, "time": 22.0})
    recs.append(step(10, 24.0, dt=0.5))
    recs += [step(n, 14 + n) for n in range(11, 16)]
    recs.append({"event": "in_process_resume", "step": 15, "fault_time": 29.5, "time": 30.0})
    recs += [step(n, 16 + n) for n in range(16, 21)]
    g = compute(tmp_path, [Attempt("", "COMPLETED", None, 0.0, 60.0, 1, 4)], now=100.0, records=recs)
    s = g["buckets_s"]
    assert s == pytest.approx(
        {"startup": 10, "restore": 0, "productive": 10 + 5 + 5, "checkpoint_stall": 0, "redone": 0.5,
         "hang_restart": 0.5 + 0.5, "recovery": 3.0 + 1.5, "idle_end": 60 - 36, "degraded": 0}
    )  # fmt: skip
    assert sum(g["buckets_gpu_s"].values()) == pytest.approx(g["allocated_gpu_s"]) == 240
    assert g["buckets_gpu_s"]["recovery"] == pytest.approx(4 * 4.5)
    assert (g["restarts"], g["in_process_recoveries"], g["steps"]["redone"]) == (0, 2, 1)


def _spec_with_nodes(run_dir: Path, nodes: int) -> None:
    (run_dir / "spec.json").write_text(json.dumps({"plan": {"nodes": nodes}}))


def test_goodput_after_a_shrink_counts_the_idle_node_as_degraded(tmp_path: Path) -> None:
    """2 nodes x 2 GPUs [0, 100], planned on both. Start 1 trains steps 1..10
    (t 9..20) and loses a node; start 2 runs on 1 node (shrunk_layout) from
    step 5: half of every second after the fault is held but not trained on."""
    _spec_with_nodes(tmp_path, 2)
    recs = [step(n, 9 + n) for n in range(1, 6)]
    recs.append({"event": "checkpoint", "step": 5, "save_s": 1.0, "time": 15.0})
    recs += [step(n, 10 + n) for n in range(6, 11)]
    recs.append({"event": "shrunk_layout", "dp": 2, "nodes": 1, "time": 30.0})
    recs.append({"event": "resume", "step": 5, "restore_s": 2.0, "time": 40.0})
    recs += [step(n, 35 + n) for n in range(6, 21)]
    g = compute(tmp_path, [Attempt("5", "COMPLETED", 0.0, 0.0, 100.0, 2, 4)], now=200.0, records=recs)
    gs = g["buckets_gpu_s"]
    # Start 1 on all 4 GPUs: steps 1..10 (t 9..20: 10 s of steps + a 1 s save), start-up 9 s.
    # Start 2 on 2 of 4: restart 20..38, restore 2, redo 6..10 (5 s), 11..20 (10 s), idle 55..100.
    assert gs["productive"] == pytest.approx(4 * 10 + 2 * 10)
    assert gs["redone"] == pytest.approx(2 * 5)
    assert gs["degraded"] == pytest.approx(2 * (100 - 20))
    assert sum(gs.values()) == pytest.approx(g["allocated_gpu_s"]) and g["allocated_gpu_s"] == 400
    assert g["ettr"] == pytest.approx((4 * 10 + 2 * 10) / 400)
    assert g["degraded_share"] == pytest.approx(160 / 400)
    assert (g["restarts"], g["allocations"]) == (1, 1)


def test_goodput_of_a_shrink_before_any_committed_checkpoint(tmp_path: Path) -> None:
    """As above, but the node is lost before a checkpoint committed: the
    shrunk start has no resume record and runs steps 1.. again from scratch.
    It is one start on 1 node of 2 (its steps are not split off from its
    shrunk_layout record), so half its seconds are degraded."""
    _spec_with_nodes(tmp_path, 2)
    recs = [step(n, 9 + n) for n in range(1, 11)]
    recs.append({"event": "shrunk_layout", "dp": 2, "nodes": 1, "time": 30.0})
    recs += [step(n, 30 + n) for n in range(1, 21)]
    g = compute(tmp_path, [Attempt("5", "COMPLETED", 0.0, 0.0, 100.0, 2, 4)], now=200.0, records=recs)
    gs = g["buckets_gpu_s"]
    assert (g["restarts"], g["steps"]["redone"]) == (1, 10), g
    assert gs["productive"] == pytest.approx(4 * 10 + 2 * 10)
    assert gs["redone"] == pytest.approx(2 * 10)
    assert gs["degraded"] == pytest.approx(2 * (100 - 19))  # from the last step of start 1 (t 19)
    assert sum(gs.values()) == pytest.approx(400)


def test_goodput_counts_waiting_spares_as_degraded(tmp_path: Path) -> None:
    """A plan on 1 node with a spare: the job holds 2 nodes, trains on one."""
    _spec_with_nodes(tmp_path, 1)
    recs = [step(n, 10 + n) for n in range(1, 11)]
    g = compute(tmp_path, [Attempt("6", "COMPLETED", 0.0, 0.0, 20.0, 2, 16)], now=30.0, records=recs)
    assert g["buckets_gpu_s"]["degraded"] == pytest.approx(8 * 20)
    assert g["buckets_gpu_s"]["productive"] == pytest.approx(8 * 10)
    assert g["ettr"] == pytest.approx(0.25)


def test_goodput_failures_are_the_supervisors_faults_once_each(tmp_path: Path) -> None:
    """failures.log has a line per failed srun step; faults.jsonl one record
    per fault (and one per resume): the count is the faults."""
    (tmp_path / "failures.log").write_text("a\nb\nc\n")
    (tmp_path / "faults.jsonl").write_text(
        json.dumps({"cause": "rank_exit", "node": "node2", "action": "restart"}) + "\n"
        + json.dumps({"event": "resumed", "seconds_lost": 3.0}) + "\n"
    )  # fmt: skip
    g = compute(tmp_path, [Attempt("7", "COMPLETED", 0.0, 0.0, 20.0, 1, 2)], now=30.0, records=[step(1, 5.0)])
    assert g["failures"] == 1


def test_goodput_of_a_running_job_is_not_final(tmp_path: Path) -> None:
    recs = [step(n, 10 + n) for n in range(1, 6)]
    g = compute(tmp_path, [Attempt("8", "RUNNING", 0.0, 5.0, None, 1, 2)], now=17.0, records=recs)
    assert g["final"] is False and g["allocated_s"] == 12
    assert g["buckets_s"]["startup"] == pytest.approx(5) and g["buckets_s"]["productive"] == pytest.approx(7)


def test_prom_text_is_valid_exposition(tmp_path: Path) -> None:
    g = compute(tmp_path, [Attempt("9", "COMPLETED", 0.0, 1.0, 11.0, 1, 8)], now=20.0, records=[step(1, 5.0)])
    text = prom_text(g, 'we"ird\\run')
    assert 'run="we\\"ird\\\\run"' in text
    if shutil.which("promtool"):
        p = subprocess.run(
            ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
        )
        assert p.returncode == 0, p.stdout + p.stderr


def test_find_runs_sweep_points_and_no_checkpoint_manifests(tmp_path: Path) -> None:
    sweep = tmp_path / "sweeps" / "s1"
    for i in range(2):
        (sweep / str(i) / "checkpoints" / "step_5").mkdir(parents=True)
        (sweep / str(i) / "spec.json").write_text("{}")
        (sweep / str(i) / "checkpoints" / "step_5" / "manifest.json").write_text("{}")
    (sweep / "manifest.json").write_text(
        json.dumps(
            {"points": [{"point": i, "run_dir": str(sweep / str(i)), "job_id": f"40_{i}"} for i in range(2)]}
        )
    )
    single = tmp_path / "tiny" / "run1"
    (single / "slurm").mkdir(parents=True)
    (single / "spec.json").write_text("{}")
    (single / "slurm" / "job.json").write_text('{"job_id": "41"}')
    refs = sorted(fleet.find_runs(tmp_path), key=lambda r: r.run_dir)
    assert [(r.sweep, r.point, r.job_id) for r in refs] == [
        ("s1", "0", "40_0"),
        ("s1", "1", "40_1"),
        ("", "", "41"),
    ]


def test_a_pipeline_is_one_line_with_its_stages_in_order(tmp_path: Path) -> None:
    pipe = tmp_path / "pipelines" / "llm-2026"
    stages = ["pretrain", "eval", "export"]
    for name in stages:
        (pipe / name).mkdir(parents=True)
        (pipe / name / "spec.json").write_text("{}")
    (pipe / "pipeline.json").write_text(
        json.dumps({"stages": [{"stage": n, "run_dir": str(pipe / n), "job_id": None} for n in stages]})
    )
    (tmp_path / "other" / "run1").mkdir(parents=True)
    (tmp_path / "other" / "run1" / "spec.json").write_text("{}")
    refs = fleet.find_runs(tmp_path)
    assert sorted((r.pipeline, r.stage) for r in refs) == [("", ""), *sorted(("llm-2026", n) for n in stages)]
    view = fleet.collect(tmp_path, write=False, now=2000.0)
    (p,) = view.pipelines
    assert p["pipeline"] == "llm-2026" and [s["stage"] for s in p["stages"]] == stages
    line = next(ln for ln in fleettext.format_view(view).splitlines() if ln.startswith("  llm-2026: "))
    assert line.startswith("  llm-2026: pretrain ") and " -> eval " in line and " -> export " in line, line
    assert view.to_json()["pipelines"] == view.pipelines


def test_fleet_refusals_name_the_value(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "launcher.cli", "fleet", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )

    out = run(str(tmp_path / "nope"))
    assert out.returncode == 2 and "RUNS_ROOT=" in out.stderr and "not a directory" in out.stderr
    out = run(str(tmp_path), "--watch", "1")
    assert out.returncode == 2 and "--watch=1 is invalid" in out.stderr
    out = run(str(tmp_path), "--budget-usd", "-5")
    assert out.returncode == 2 and "--budget-usd=-5 is invalid" in out.stderr


def test_fleet_import_is_light() -> None:
    code = (
        "import sys, launcher.fleet, launcher.views.fleetrows, launcher.views.goodput\n"
        "bad = [m for m in ('torch', 'matplotlib', 'hydra') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr


def test_fleet_shows_the_bad_node_ledger(tmp_path: Path) -> None:
    from launcher.config import nodeledger

    path = tmp_path / nodeledger.LEDGER_FILE
    for cause in ("hang", "node_fail"):
        nodeledger.append(path, {"node": "node3", "time": 1000.0, "cause": cause, "run": "a", "job": "1"})
    nodeledger.append(path, {"node": "node1", "time": 1000.0, "cause": "hang", "run": "b", "job": "2"})
    view = fleet.collect(tmp_path, write=False, now=2000.0)
    assert view.bad_nodes == [
        {"node": "node1", "faults": 1, "causes": ["hang"], "last": 1000.0, "excluded": False},
        {"node": "node3", "faults": 2, "causes": ["hang", "node_fail"], "last": 1000.0, "excluded": True},
    ]
    assert "bad-node ledger" in fleettext.format_view(view)


def test_qos_share_counts_the_whole_cluster(tmp_path: Path) -> None:
    """testcluster asks for 1 node but the cluster has cluster_nodes=4 x 8
    GPUs: research's 40% is 12 GPUs, Slurm's GrpTRES (qos-admin's rounding)."""
    assert fleet.cluster_gpus({"name": "testcluster", "nodes": 1, "gpus_per_node": 2}) == 32
    assert fleet.cluster_gpus({"name": "nosuch", "nodes": 2, "cluster_nodes": 0, "gpus_per_node": 8}) == 16
    spec = {"cfg": {"cluster": {"name": "testcluster", "nodes": 1, "gpus_per_node": 2}}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    row = fleet.RunRow("r", str(tmp_path), "", "", "1", "RUNNING", qos="research", gpus=2)
    (q,) = fleet.totals([row])["qos"]
    assert (q["share_gpus"], q["gpus_now"], q["in_use_pct"]) == (12, 2, pytest.approx(100 * 2 / 12))


class RecordedScheduler:
    """sacct's answer recorded (one line per start, ACCOUNTING_FIELDS); no Slurm."""

    def __init__(self, rows: list[dict[str, str]]) -> None:
        self.rows, self.calls, self.error = rows, 0, None

    def fetch(self, job_ids: list[str]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        self.calls += 1
        return [r for r in self.rows if r["JobID"] in job_ids], []


def test_budget_from_config_and_the_flag_overrides(tmp_path: Path) -> None:
    """launcher.budget_usd of the newest run is the budget; --budget-usd wins."""
    import os

    for name, job, budget, mtime in (("old", "41", 900.0, 1000), ("new", "42", 500.0, 2000)):
        run = tmp_path / name
        (run / "slurm").mkdir(parents=True)
        cfg = {"cluster": {"price_on_demand_usd_per_node_hour": 180}, "launcher": {"budget_usd": budget}}
        (run / "spec.json").write_text(json.dumps({"cfg": cfg}))
        os.utime(run / "spec.json", (mtime, mtime))
        (run / "slurm" / "job.json").write_text(json.dumps({"job_id": job}))
    rows = [
        {"JobID": j, "State": "COMPLETED", "Submit": "900", "Start": "1000", "End": "4600", "NNodes": "1",
         "AllocTRES": "gres/gpu=8", "User": "alice", "QOS": "research", "Partition": "debug"}
        for j in ("41", "42")
    ]  # fmt: skip
    view = fleet.collect(tmp_path, RecordedScheduler(rows), write=False, now=5000.0)  # type: ignore[arg-type]
    assert view.budget is not None
    assert view.budget["budget_usd"] == 500.0 and view.budget["source"].endswith("new")
    assert view.budget["spent_usd"] == pytest.approx(360.0) and view.budget["left_usd"] == pytest.approx(
        140.0
    )
    text = fleettext.format_view(view)
    assert "budget $500.00: spent $360.00, left $140.00" in text and "launcher.budget_usd of" in text
    view = fleet.collect(tmp_path, RecordedScheduler(rows), budget_usd=300.0, write=False, now=5000.0)  # type: ignore[arg-type]
    assert view.budget is not None and view.budget["source"] == "--budget-usd"
    assert view.budget["left_usd"] == pytest.approx(-60.0) and "OVER BUDGET" in fleettext.format_view(view)
    for run in tmp_path.iterdir():  # no run sets one: no budget line
        spec = json.loads((run / "spec.json").read_text())
        spec["cfg"]["launcher"]["budget_usd"] = 0.0
        (run / "spec.json").write_text(json.dumps(spec))
    view = fleet.collect(tmp_path, RecordedScheduler(rows), write=False, now=5000.0)  # type: ignore[arg-type]
    assert view.budget is None and "budget $" not in fleettext.format_view(view)


def test_budget_usd_refused_when_negative(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "launcher", "cluster=testcluster", "model=tiny", "launcher.budget_usd=-1",
         "launcher.dry_run=true", f"launcher.run_dir={tmp_path / 'r'}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode != 0 and "launcher.budget_usd" in out.stderr and "-1" in out.stderr, out.stderr
    assert not (tmp_path / "r").exists()


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_fleet_server_checks_host_and_its_gets_write_nothing(tmp_path: Path) -> None:
    """The web page's server, real HTTP on 127.0.0.1: a Host that is not its
    address (DNS rebinding: a page of evil.example renamed to 127.0.0.1) is
    refused with 421 and no data; 127.0.0.1 and localhost are answered; no
    GET writes into the runs root (a finished Slurm run's goodput.json was
    written on every GET before), and the view still has its goodput."""
    import http.client
    import threading

    from launcher.views.fleetweb import make_server

    run = tmp_path / "runs" / "ended"
    (run / "slurm").mkdir(parents=True)
    cfg = {"cluster": {"name": "testcluster", "price_on_demand_usd_per_node_hour": 180},
           "model": {"name": "tiny"}, "job": {"kind": "pretrain"}}  # fmt: skip
    (run / "spec.json").write_text(json.dumps({"cfg": cfg}))
    (run / "slurm" / "job.json").write_text(json.dumps({"job_id": "41"}))
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps(step(n, 1000.0 + 10 * n)) + "\n" for n in range(1, 5))
    )
    rows = [{"JobID": "41", "State": "COMPLETED", "Submit": "900", "Start": "1000", "End": "1100", "NNodes": "1",
             "AllocTRES": "gres/gpu=8", "User": "alice", "QOS": "research", "Partition": "debug"}]  # fmt: skip
    before = _files(tmp_path / "runs")
    server = make_server(tmp_path / "runs", "127.0.0.1", 0, RecordedScheduler(rows))  # type: ignore[arg-type]
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()

    token = server.token  # type: ignore[attr-defined]

    def get(path: str, host: str, cookie: str | None = None, query: str | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        query = f"token={token}" if query is None and cookie is None else query
        conn.putrequest("GET", f"{path}?{query}" if query else path, skip_host=True)
        conn.putheader("Host", host)
        if cookie is not None:
            conn.putheader("Cookie", cookie)
        conn.endheaders()
        resp = conn.getresponse()
        out = resp.status, resp.read()
        conn.close()
        return out

    try:
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", ""):
            status, body = get("/api/fleet.json", host)
            assert status == 421 and b"ended" not in body and b"is not this server's address" in body, (
                host,
                body,
            )
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
            status, body = get("/api/fleet.json", host)
            assert status == 200, (host, body)
            (row,) = json.loads(body)["runs"]
            assert (row["model"], row["cluster"], row["program"]) == ("tiny", "testcluster", "pretrain")
            assert row["goodput"]["final"] and row["goodput"]["buckets_gpu_s"]["productive"] > 0, row
        for path in ("/", "/team.svg", "/api/fleet.json"):
            assert get(path, f"127.0.0.1:{port}")[0] == 200
        index = get("/", f"127.0.0.1:{port}")[1].decode()
        assert "<th data-kind='text' data-key='model'" in index and ">tiny</td>" in index
        # The token: asked of every request (query once, then the cookie it set).
        here = f"127.0.0.1:{port}"
        for query, cookie in (("", None), ("token=wrong", None), (f"token={token[:-1]}", None), ("", "x=1")):
            status, body = get("/api/fleet.json", here, cookie=cookie, query=query)
            assert status == 403 and b"ended" not in body and b"?token=" in body, (query, cookie, body)
        assert get("/api/fleet.json", here, cookie=f"meshrun_fleet_token={token}", query="")[0] == 200
    finally:
        server.shutdown()
        server.server_close()
    assert _files(tmp_path / "runs") == before, "a GET wrote into the runs root"


def test_goodput_of_a_program_that_reports_no_step(tmp_path: Path) -> None:
    """job=script, no step printed: its wrapper's start and exit records
    place it. [0, 100] on 2 GPUs: it starts at 10, is killed at 40 (its exit
    record), starts again at 55, exits at 90: start-up 10, productive 30 +
    35, the restart 15, idle 10; one restart."""
    recs = [
        {"event": "program_start", "pid": 1, "time": 10.0},
        {"event": "program_exit", "rc": -9, "stopped": False, "time": 40.0},
        {"event": "program_start", "pid": 2, "time": 55.0},
        {"event": "program_exit", "rc": 0, "stopped": False, "time": 90.0},
    ]
    g = compute(tmp_path, [Attempt("5", "COMPLETED", 0.0, 0.0, 100.0, 1, 2)], now=200.0, records=recs)
    s = {k: v for k, v in g["buckets_s"].items() if v}
    assert s == pytest.approx({"startup": 10, "productive": 65, "hang_restart": 15, "idle_end": 10})
    assert g["restarts"] == 1 and g["ettr"] == pytest.approx(0.65)
    # Still running in its second start: productive up to now.
    running = compute(tmp_path, [Attempt("5", "RUNNING", 0.0, 0.0, None, 1, 2)], now=70.0, records=recs[:3])
    assert running["buckets_s"]["productive"] == pytest.approx(30 + 15)
    assert running["restarts"] == 1
