"""Local runs end cleanly whatever happens (launcher/run/local.py,
launcher/run/runlock.py, train/observe/lifeline.py): a failing rank ends the whole run
within seconds, named, with its last log lines; ranks never outlive the
launcher; a run dir has one owner at a time. Real trainer, 2 gloo ranks.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_local_lifetime.py."""

from __future__ import annotations

from pathlib import Path

from launcher.run.local import first_failure

SEQ, VOCAB = 64, 256  # model=tiny


def test_failures_log_names_the_first_rank_of_this_start(tmp_path: Path) -> None:
    """The launcher names the rank from failures.log, not from the order the
    exits were reaped: the earliest line of this start, local runs only."""
    started = 1000.0
    assert first_failure(tmp_path, started) is None  # no file
    (tmp_path / "failures.log").write_text(
        "local 0 rank 0 990.000: an earlier start's failure\n"
        "4242 0 rank 3 1001.000: a Slurm job's line\n"
        "local 0 rank 0 1002.500: RuntimeError: Connection reset by peer\n"
        "garbage without the format\n"
        "local 0 rank 1 1002.000: IndexError: index out of range in self\n"
    )
    assert first_failure(tmp_path, started) == (1, "IndexError: index out of range in self")
    assert first_failure(tmp_path, 2000.0) is None
