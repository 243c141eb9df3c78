"""Issue 51: one run, one record. Every view (status, fleet, the page, the
API, goodput.json) reads the same figures from launcher/views/runsummary.py,
over every job of the run; views fit the program. No subprocess: run dirs
built in tmp_path, sacct recorded."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from launcher.slurm import cluster, submit
from launcher.views import fleetrows, fleettext, goodputend, runstate
from launcher.views import goodput as gp
from launcher.views.fleetweb import answer, run_page

ACCT = "JobID|JobName|State|Submit|Start|End|NNodes|NodeList|AllocTRES|ReqTRES|ExitCode|Reason|Partition|QOS|User|Account"


def sacct_line(job: str, state: str, start: int, end: int | str, gpus: int = 2) -> str:
    return (
        f"{job}|x|{state}|{start - 5}|{start}|{end}|1|node1|cpu=2,gres/gpu={gpus},node=1|gres/gpu={gpus}"
        "|0:0|None|debug|research|alice|research"
    )


def rows_of(lines: list[str]) -> list[dict[str, str]]:
    return [dict(zip(ACCT.split("|"), ln.split("|"), strict=True)) for ln in lines]


class RecordedScheduler:
    """sacct's answer recorded; no Slurm (as tests/local/test_fleet_units.py)."""

    def __init__(self, rows: list[dict[str, str]]) -> None:
        self.rows, self.calls, self.error = rows, 0, None

    def fetch(self, job_ids: list[str]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        self.calls += 1
        return [r for r in self.rows if r["JobID"] in job_ids], []


def fake_sacct(monkeypatch: pytest.MonkeyPatch, lines: list[str]) -> None:
    def run(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        ids = next(a for i, a in enumerate(args) if args[i - 1] == "-j").split(",")
        out = "".join(ln + "\n" for ln in lines if ln.split("|")[0] in ids)
        return subprocess.CompletedProcess(args, 0, out, "")

    monkeypatch.setattr(cluster, "run", run)


def script_run(run: Path, *, total: int = 0, price: float = 0.0, args: list[str] | None = None) -> Path:
    cfg = {
        "job": {"kind": "script", "script": "/src/ddp_toy.py", "args": args or ["--save-every", "5"]}
        | ({"total_steps": total} if total else {}),
        "train": {"steps": 40, "global_batch_size": 8},
        "model": {"name": "tiny", "seq_len": 256},
        "cluster": {"name": "testcluster", "price_on_demand_usd_per_node_hour": price},
    }
    (run / "slurm").mkdir(parents=True, exist_ok=True)
    (run / "spec.json").write_text(json.dumps({"cfg": cfg, "plan": {"nodes": 1}}))
    return run


def step(n: int, t: float) -> str:
    return json.dumps({"step": n, "loss": None, "step_time_s": 1.0, "time": t}) + "\n"


def event(name: str, t: float) -> str:
    return json.dumps({"event": name, "time": t}) + "\n"


def two_job_run(tmp_path: Path) -> Path:
    """Job 41 (a restart after a SIGKILL inside it: the program resumed from its
    own checkpoint at step 10 after reaching 15), then job 42 extending it."""
    run = script_run(tmp_path / "runs" / "r1")
    submit._write_job_file(str(run), "41")
    submit._write_job_file(str(run), "42")
    lines = [event("program_start", 1001)] + [step(n, 1001 + n) for n in range(1, 16)]
    lines += [event("program_start", 1020)] + [step(n, 1010 + n) for n in range(11, 21)]
    lines += [event("program_exit", 1031)]
    lines += [event("program_start", 2001)] + [step(n, 1981 + n) for n in range(21, 31)]
    (run / "metrics.jsonl").write_text("".join(lines))
    faults = [
        {"cause": "killed", "node": "node1", "action": "restart", "time": 1016},
        {"event": "resumed", "steps_redone": 99, "seconds_lost": 3, "time": 1021},
    ]
    (run / "faults.jsonl").write_text("".join(json.dumps(f) + "\n" for f in faults))
    return run


SACCT = [sacct_line("41", "COMPLETED", 1000, 1040), sacct_line("42", "COMPLETED", 2000, 2020)]


def test_job_record_keeps_every_job_and_reads_old_run_dirs(tmp_path: Path) -> None:
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "job.json").write_text('{"job_id": "7"}')  # before the history was kept
    assert submit.read_job_ids(tmp_path) == ["7"]
    submit._write_job_file(str(tmp_path), "8")
    submit._write_job_file(str(tmp_path), "9", array_index=2)
    assert submit.read_job_ids(tmp_path) == ["7", "8", "9_2"] and submit.read_job_id(tmp_path) == "9_2"
    assert json.loads((tmp_path / "slurm" / "job.json").read_text())["job_id"] == "9_2"


def test_every_view_agrees_over_the_runs_whole_life(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An extension (job 42) adds to the run's GPU-seconds; restarts, faults,
    redone steps, state and last step are the same in status, fleet, the
    page's JSON and goodput.json."""
    run = two_job_run(tmp_path)
    fake_sacct(monkeypatch, SACCT)
    rows = runstate.table(run, now=3000.0)
    view = fleetrows.collect(tmp_path / "runs", RecordedScheduler(rows_of(SACCT)), write=False, now=3000.0)  # type: ignore[arg-type]
    body, _, _ = answer(view, "/api/fleet.json")
    page = json.loads(body)["runs"][0]
    g = json.loads((run / gp.GOODPUT_FILE).read_text())
    st, fl = rows[0], view.runs[0]
    gpu_s = (40 + 20) * 2  # both jobs' allocations, 2 GPUs each
    assert g["allocated_gpu_s"] == gpu_s and g["job_ids"] == ["41", "42"]
    assert fl.gpu_hours == pytest.approx(gpu_s / 3600) and page["gpu_hours"] == pytest.approx(gpu_s / 3600)
    assert st.gpu_hours == f"{gpu_s / 3600:.3f}"
    # Restarts: the SIGKILL's restart inside job 41 and job 42's start.
    assert g["restarts"] == 2 and fl.restarts == 2 and page["restarts"] == 2 and st.restarts == "2"
    # One fault (a "resumed" line is no fault); steps 11..15 redone (the program resumed at 10).
    assert gp._fault_count(run) == g["failures"] == fl.faults == page["faults"] == 1 and st.faults == "1"
    assert g["steps"]["redone"] == 5 and fl.redone == 5 and page["redone"] == 5 and st.redone == "5"
    assert "5 step(s) redone" in runstate.fault_lines(rows)[0] and "faults 1" in runstate.fault_lines(rows)[0]
    assert st.state == fl.state == page["state"] == g["state"] == "COMPLETED"
    assert st.step == "30" and fl.step == page["step"] == 30
    assert page["job_ids"] == ["41", "42"]


def test_an_extensions_batch_end_keeps_the_earlier_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch script's goodput.json at job 42's end covers job 41 too:
    GPU-seconds never go down when a later job starts in the same run dir."""
    run = two_job_run(tmp_path)
    fake_sacct(monkeypatch, [SACCT[0], sacct_line("42", "RUNNING", 2000, "Unknown")])
    before = goodputend.refresh([(str(run), "42")], now=2010.0)[str(run)]["allocated_gpu_s"]
    g = goodputend.finish(run, "42", 0, now=2020.0)
    assert before == (40 + 10) * 2 and g["allocated_gpu_s"] == (40 + 20) * 2 and g["final"]
    assert g["job_ids"] == ["41", "42"] and g["finalised_by"] == "batch script"


def test_a_script_run_shows_its_program_and_only_what_is_known(tmp_path: Path) -> None:
    """No model, no train.steps, no tokens, no cost without a price: '-', never 0."""
    run = script_run(tmp_path / "runs" / "s", args=["--steps", "300"])
    submit._write_job_file(str(run), "41")
    (run / "metrics.jsonl").write_text("".join(step(n, 1001 + n) for n in range(1, 31)))
    rows = rows_of([sacct_line("41", "RUNNING", 1000, "Unknown")])
    view = fleetrows.collect(tmp_path / "runs", RecordedScheduler(rows), write=False, now=1040.0)  # type: ignore[arg-type]
    r = view.runs[0]
    assert r.program == "ddp_toy.py --steps 300" and r.model == "" and r.steps is None
    assert r.tokens is None and r.cost_usd is None and r.projected_usd is None
    text = fleettext.format_view(view)
    line = next(ln for ln in text.splitlines() if ln.startswith(r.run))
    assert "tiny" not in line and " 30 " in line and "/40" not in line and "0.00" not in line
    assert "ddp_toy.py --steps 300" in line
    # The total when known: job.total_steps.
    script_run(run, total=300)
    view = fleetrows.collect(tmp_path / "runs", RecordedScheduler(rows), write=False, now=1040.0)  # type: ignore[arg-type]
    assert view.runs[0].steps == 300 and "30/300" in fleettext.format_view(view)
    assert "30/300" in run_page(view, view.runs[0]).decode()


def test_a_sweeps_rows_are_named_by_their_swept_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Hydra multirun dir's manifest names each point by its overrides, in
    fleet and status; status of the multirun dir lists its points."""
    sweep = tmp_path / "runs" / "01-02-03"
    points = []
    for i, lr in enumerate(("0.1", "0.2")):
        run = script_run(sweep / str(i))
        points.append({"point": i, "overrides": [f"lr={lr}"], "run_dir": str(run), "job_id": f"50_{i}"})
    sweep.joinpath("manifest.json").write_text(json.dumps({"points": points}))
    (sweep / "slurm").mkdir()
    lines = [sacct_line(f"50_{i}", "COMPLETED", 1000, 1010) for i in range(2)]
    fake_sacct(monkeypatch, lines)
    rows = runstate.table(sweep, now=2000.0)
    assert [r.point for r in rows] == ["lr=0.1", "lr=0.2"] and {r.state for r in rows} == {"COMPLETED"}
    view = fleetrows.collect(tmp_path / "runs", RecordedScheduler(rows_of(lines)), write=False, now=2000.0)  # type: ignore[arg-type]
    assert sorted(r.run for r in view.runs) == ["01-02-03/lr=0.1", "01-02-03/lr=0.2"]
    # Without its manifest (not written yet): its point dirs, not NOT SUBMITTED.
    sweep.joinpath("manifest.json").unlink()
    assert [Path(d).name for _, d, _ in runstate.runs_of(sweep)] == ["0", "1"]


def test_a_running_job_never_says_finished(tmp_path: Path) -> None:
    """A running script past its known total, or with none, is not 'finished in'."""
    from harness import spec_of

    from launcher.views.runforecast import run_forecast

    spec = spec_of(tmp_path, "job.total_steps=20")
    run = Path(spec.run_dir)
    (run / "metrics.jsonl").write_text("".join(step(n, 1001 + n) for n in range(1, 31)))
    f = run_forecast(run, running=True)
    assert f is not None and not f.finished and "finished" not in f.line()
    assert run_forecast(run, finished=True) is not None and run_forecast(run, finished=True).finished  # type: ignore[union-attr]
    spec = spec_of(tmp_path / "b")  # no total: no forecast while it runs
    (Path(spec.run_dir) / "metrics.jsonl").write_text("".join(step(n, 1001 + n) for n in range(1, 31)))
    assert run_forecast(spec.run_dir, running=True) is None
