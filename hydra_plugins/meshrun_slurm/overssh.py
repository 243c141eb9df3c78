"""``hydra/launcher=meshrun_slurm`` for a cluster behind its login node
(``hydra.launcher.login`` or ``cluster.login``): a Hydra app's sweep
submitted from a machine without Slurm, over the user's own ssh.

Here: every point checked and pickled as on the login node, with the job
dirs in the sweep dir on the cluster (``hydra.sweep.dir`` when given, inside
the runs root; else ``<launcher.runs_root>/sweeps/<name>``); the meshrun
code, the user's presets and the app's project dir (where the app was
started: ``job.workdir``) shipped content-addressed
(launcher/entry/sshsubmit.py). Then the pickles and each point's meshrun
overrides (``job.workdir``/``job.script``: the shipped copies) go as one tar
on the stdin of ``python -m hydra_plugins.meshrun_slurm.remotesubmit SWEEP_DIR``
on the login node (remotesubmit.py), which composes and checks each point
again, submits the one job array and prints the job ids; a refusal there
removes what it wrote. The launch returns at once
(``hydra.launcher.wait=false`` only: the results stay on the cluster), each
point's value a ``RemoteRun`` handle.
"""

import io
import json
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, filter_overrides
from omegaconf import DictConfig

BUNDLE = "points.json"
SUBMITTED = "meshrun_slurm: submitted over SSH "  # + the job ids, JSON
# Set on the login node: Slurm is local there; the project's paths are the shipped copies.
OWN_KEYS = ("cluster.login", "job.workdir", "job.script")


def launch_over_ssh(
    launcher: Any,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    conf: DictConfig,
    extra: dict[str, str],
    first: Any,
) -> list[JobReturn]:
    """Check and pickle every point for the sweep dir on the cluster, ship,
    submit there; each point's pending JobReturn (a RemoteRun handle)."""
    from launcher.api import RemoteRun
    from launcher.config.validate import fail
    from launcher.entry.sshsubmit import check_remote_paths, checked_and_shipped, remote_program
    from launcher.slurm.cluster import SlurmUnavailable
    from launcher.slurm.remote import RemoteError, remote_run

    cfg = first.cfg
    if conf.wait:
        raise fail(
            "hydra.launcher.wait",
            True,
            f"over SSH (cluster.login={cfg.cluster.login}) the results stay on the cluster: set "
            "hydra.launcher.wait=false (the launch returns at once, each point a run handle)",
        )
    config = launcher.config
    here = Path(str(config.hydra.sweep.dir)).resolve()
    given = any(str(o).startswith("hydra.sweep.dir=") for o in config.hydra.overrides.hydra)
    there = str(here) if given else f"{cfg.launcher.runs_root.rstrip('/')}/sweeps/{here.name}"
    check_remote_paths(cfg, there, "hydra.sweep.dir")
    points = [
        launcher._point(initial_job_idx + i, o, Path(there), conf, pin=True)
        for i, o in enumerate(job_overrides)
    ]
    try:
        login, sent = checked_and_shipped(cfg, there, "hydra.sweep.dir")
        bundle = _bundle(points, job_overrides, extra, sent, cfg)
        line = remote_program(
            cfg, sent, ["-m", "hydra_plugins.meshrun_slurm.remotesubmit", there], points[0][1].meshrun
        )
        out = remote_run(login, [cfg.cluster.python, "-m", "hydra_plugins.meshrun_slurm.remotesubmit"],
                         line=line, stdin=bundle, timeout=600)  # fmt: skip
    except RemoteError as e:
        raise SlurmUnavailable(str(e)) from e
    sys.stdout.write("".join(ln for ln in out.stdout.splitlines(True) if not ln.startswith(SUBMITTED)))
    sys.stderr.write(out.stderr)
    said = [ln[len(SUBMITTED) :] for ln in out.stdout.splitlines() if ln.startswith(SUBMITTED)]
    if out.returncode or not said:
        raise SlurmUnavailable(
            f"{login.host}: the sweep was not submitted there (exit {out.returncode}; its output above)"
        )
    ids = json.loads(said[-1])
    launcher.job_ids = ids
    sent_said = f"{sent.files} files, {sent.bytes / 1e6:.1f} MB sent" if sent.files else "nothing sent"
    print(
        f"meshrun_slurm: submitted over SSH to {login}: {len(ids)} points ({sent_said}; project "
        f"{sent.project_digest[:16]}); follow: meshrun status {login}:{there}",
        flush=True,
    )
    return [
        pending_ret(pickle.config, spec.run_dir, jid, RemoteRun(spec.run_dir, jid, login=cfg.cluster.login))
        for (spec, pickle), jid in zip(points, ids, strict=True)
    ]


def pending_ret(config: DictConfig, run_dir: str, job: str, handle: Any) -> JobReturn:
    from hydra_plugins.meshrun_slurm.point import pending_return

    return pending_return(config, run_dir, job, handle, write=False)


def _bundle(
    points: list[tuple[Any, Any]],
    job_overrides: Sequence[Sequence[str]],
    extra: dict[str, str],
    sent: Any,
    cfg: Any,
) -> bytes:
    """The tar the login node reads: each point's pickle and points.json
    (its meshrun overrides with the shipped paths, run dir, Hydra overrides)."""
    from launcher.entry.sshsubmit import project_overrides

    own = [*project_overrides(cfg, sent), "cluster.login="]
    rows = [
        {
            "pickle": Path(pickle.path).name,
            "meshrun": [o for o in pickle.meshrun if o.lstrip("+").split("=", 1)[0] not in OWN_KEYS] + own,
            "run_dir": spec.run_dir,
            "overrides": list(filter_overrides(o)),
        }
        for (spec, pickle), o in zip(points, job_overrides, strict=True)
    ]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for (_, pickle), row in zip(points, rows, strict=True):
            _add(tar, row["pickle"], _pickled(pickle.submission))
        _add(tar, BUNDLE, json.dumps({"points": rows, "extra": extra}).encode())
    return buf.getvalue()


def _pickled(submission: Any) -> bytes:
    """submitit's DelayedSubmission as its dump() writes it (cloudpickle)."""
    import cloudpickle

    return cloudpickle.dumps(submission)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o600
    tar.addfile(info, io.BytesIO(data))
