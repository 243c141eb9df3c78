"""The CLI as one family (issue 36), through the commands users type: a
local run's status, logs and cancel; a finished run started again; typo
suggestions; complete help; one run name in status and fleet.

One tiny local run (module fixture) serves every test that reads a run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli import COMMANDS
from launcher.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
STEPS = 2


def meshrun(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def launcher(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(run dir, run id) of a completed local run, under its own runs root."""
    root = tmp_path_factory.mktemp("runs")
    run_dir = root / "tiny"
    p = launcher("model=tiny", f"train.steps={STEPS}", f"launcher.run_dir={run_dir}", cwd=root)
    assert p.returncode == 0, p.stdout + p.stderr
    return run_dir, (run_dir / "run_id").read_text().strip()


def test_status_of_a_local_run_reads_its_result(finished: tuple[Path, str]) -> None:
    run_dir, run_id = finished
    p = meshrun("status", str(run_dir))
    assert p.returncode == 0, p.stderr
    assert "NOT SUBMITTED" not in p.stdout
    head = next(line for line in p.stdout.splitlines() if line.startswith("RUN ")).split()
    row = dict(
        zip(
            head,
            next(line for line in p.stdout.splitlines() if line.startswith(run_id)).split(),
            strict=False,
        )
    )
    assert row["STATE"] == "COMPLETED" and row["STEP"] == f"{STEPS}/{STEPS}", p.stdout
    assert p.stdout.splitlines()[1].rstrip().endswith(str(run_dir)), p.stdout


def test_logs_of_a_local_run_tail_rank0(finished: tuple[Path, str]) -> None:
    run_dir, run_id = finished
    p = meshrun("logs", str(run_dir), "-n", "5")
    assert p.returncode == 0, p.stderr
    assert (
        f"==> {run_id} local run, rank 0 of 2 (--rank N, --rank all: the others): {run_dir / 'logs' / 'rank0.log'}"
        in p.stdout
    )
    assert f"done: step {STEPS}" in p.stdout and "no output yet" not in p.stdout


def test_cancel_of_a_finished_local_run_says_nothing_to_cancel(finished: tuple[Path, str]) -> None:
    run_dir, run_id = finished
    p = meshrun("cancel", str(run_dir))
    assert p.returncode == 1, p.stdout + p.stderr
    assert (
        f"meshrun: nothing to cancel: run {run_id} ({run_dir}) is not running (COMPLETED at step {STEPS})"
        in p.stderr
    )


def test_cancel_stops_a_running_local_run_by_its_launcher_pid(tmp_path: Path) -> None:
    """A stand-in launcher holds the run dir's lock as a local run does
    (the lock records its pid); status says RUNNING, cancel stops it."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "run_id").write_text("tiny-local-20261203T000000Z-abcd\n")
    (run_dir / "spec.json").write_text("{}")  # what makes it a run dir for status
    hold = (
        "import sys, time\nfrom launcher.run.runlock import own_run_dir\n"
        f"with own_run_dir({str(run_dir)!r}):\n    print('ready', flush=True)\n    time.sleep(120)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", hold],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        status = meshrun("status", str(run_dir))
        assert status.returncode == 0 and " RUNNING " in status.stdout, status.stdout + status.stderr
        p = meshrun("cancel", str(run_dir))
        assert p.returncode == 0, p.stdout + p.stderr
        assert (
            f"meshrun: cancelled run tiny-local-20261203T000000Z-abcd ({run_dir}) (launcher pid {owner.pid})"
            in p.stdout
        )
        assert owner.wait(timeout=30) != 0  # it was signalled, not left to finish
        after = meshrun("status", str(run_dir))
        assert " STOPPED " in after.stdout, after.stdout
    finally:
        owner.kill()
        owner.wait()


def test_a_finished_run_started_again_starts_no_ranks(finished: tuple[Path, str]) -> None:
    run_dir, run_id = finished
    log = run_dir / "logs" / "rank0.log"
    before = log.stat().st_size
    p = launcher("model=tiny", f"train.steps={STEPS}", f"launcher.run_dir={run_dir}", cwd=run_dir.parent)
    assert p.returncode == 0, p.stderr
    assert (
        f"meshrun: run {run_id} already completed: final step {STEPS} of train.steps={STEPS}; "
        "nothing was started. To train further, raise train.steps: "
        f"python -m launcher launcher.run_dir={run_dir} train.steps={2 * STEPS}"
    ) in p.stdout
    assert log.stat().st_size == before  # no rank wrote a line


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("modle=13b", "meshrun: error: unknown key 'modle': did you mean 'model'?"),
        ("train.lrr=1", "meshrun: error: unknown key 'train.lrr': did you mean 'train.lr'?"),
        ("model=13bb", "meshrun: error: unknown model option '13bb' (model=13bb): did you mean '13b'? "),
        ("train.qqqzz=1", "meshrun: error: unknown key 'train.qqqzz': no field 'qqqzz' under train; valid: "),
    ],
)
def test_a_typo_gets_the_nearest_name(tmp_path: Path, override: str, expected: str) -> None:
    p = launcher(override, f"launcher.run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert expected in p.stderr and "+modle" not in p.stderr, p.stderr
    assert sorted(os.listdir(tmp_path)) == []  # nothing written
    if override.startswith("model="):
        assert "choose one of 125m, 13b" in p.stderr


def test_a_typo_in_a_composing_command(tmp_path: Path) -> None:
    p = meshrun("predict", "modle=13b", cwd=tmp_path)
    assert p.returncode == 2 and "unknown key 'modle': did you mean 'model'?" in p.stderr, p.stderr


_MARKUP = re.compile(r"``|:(func|mod|class|data|meth):`")


@pytest.mark.parametrize("command", ["status", "logs", "cancel", "cost", "predict", "fleet", "nodes"])
def test_help_is_complete(command: str) -> None:
    p = meshrun(command, "--help")
    assert p.returncode == 0, p.stderr
    text = p.stdout
    paragraphs = text.split("\n\n")
    assert paragraphs[0].startswith(f"usage: meshrun {command}")
    description = " ".join(paragraphs[1].split())
    assert description[0].isupper() and description.endswith("."), description  # a whole sentence
    assert not _MARKUP.search(text), text
    if command in ("status", "cancel"):
        assert "--lines" not in text and "-n LINES" not in text, text
    if command in ("fleet", "nodes"):
        assert "[RUNS_ROOT]" in text and "--runs-root" not in text, text  # one style, positional
    if command == "cost":
        assert "--model" not in text and "model=13b" in text, text


def test_every_command_help_has_a_plain_description(capsys: pytest.CaptureFixture[str]) -> None:
    """Every subcommand in one process (each subprocess would cost a second)."""
    for name in COMMANDS:
        if name == "run":
            continue  # Hydra's --help, conf/config.yaml's header
        try:
            code = cli_main([name, "--help"])
        except SystemExit as e:
            code = e.code
        out = capsys.readouterr().out
        assert code == 0, (name, out)
        assert not _MARKUP.search(out), (name, out)
        parts = out.split("\n\n")
        assert len(parts) >= 2 and parts[1].strip()[:1].isupper(), (name, out)


def test_cost_takes_the_model_as_every_command_does(tmp_path: Path) -> None:
    p = meshrun("cost", "model=7b", "--clusters", "1node", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("model=7b, "), p.stdout
    old = meshrun("cost", "--model", "7b", "--clusters", "1node", cwd=tmp_path)  # deprecated alias
    assert old.returncode == 0 and old.stdout.startswith("model=7b, "), old.stderr


def test_nodes_takes_the_runs_root_positionally(tmp_path: Path) -> None:
    p = meshrun("nodes", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"bad-node ledger {tmp_path / 'bad_nodes.jsonl'}: 0 line(s)"), p.stdout


def test_status_and_fleet_name_a_run_by_its_id(finished: tuple[Path, str]) -> None:
    run_dir, run_id = finished
    fleet = meshrun("fleet", str(run_dir.parent), "--no-write")
    assert fleet.returncode == 0, fleet.stderr
    row = next(line for line in fleet.stdout.splitlines() if line.startswith(run_id)).split()
    assert row[5] == "COMPLETED" and row[6] == f"{STEPS}/{STEPS}" and row[-1] == run_dir.name, fleet.stdout
    status = meshrun("status", str(run_dir))
    assert status.stdout.splitlines()[1].startswith(run_id), status.stdout
