"""Hydra Sweeper and Launcher for ``python -m launcher -m ...`` sweeps: plan
every point, report the invalid ones with their reason, submit the valid
Slurm points as job arrays (one per distinct resource request) and return at
once, writing ``<sweep dir>/manifest.json`` (point, overrides, status, job
id, run dir, reason).

Points on ``cluster=local`` go through the normal task function one after
another. A dry-run sweep prints one table, a row per point, from the plans
its checks made (launcher/views/sweepdry.py); with ``launcher.verbose`` (``-v``)
each dry-run point goes through the task function instead and prints its
full plan and sbatch script. Every point is checked (launcher/run/prepare.py) before
anything is written: a refused point leaves nothing, a sweep with no accepted
point leaves no sweep dir, and a failed submission removes the run dirs it
wrote. Status of a point: ``submitted``, ``ran here`` (exit 0), ``dry run``,
``invalid`` (refused input), ``failed`` (Slurm error, or a local run that
exited non-zero). Exit code: 2 when no point is valid, 3 when a valid point
failed, else 0.
"""

# No `from __future__ import annotations`: Hydra scans plugins without
# registering the module, and dataclasses then cannot resolve string types.
import copy
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.errors import HydraException
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from launcher.config.runfiles import MANIFEST_FILE

log = logging.getLogger(__name__)
MANIFEST = MANIFEST_FILE


@dataclass
class MeshrunLauncherConf:
    _target_: str = "hydra_plugins.meshrun_launcher.meshrun_launcher.MeshrunLauncher"
    # Check partition / qos / account against the live cluster before submitting.
    check: bool = True


@dataclass
class MeshrunSweeperConf:
    _target_: str = "hydra_plugins.meshrun_launcher.meshrun_launcher.MeshrunSweeper"
    max_batch_size: int | None = None
    params: dict | None = None


ConfigStore.instance().store(
    group="hydra/launcher", name="meshrun", node=MeshrunLauncherConf, provider="meshrun"
)
ConfigStore.instance().store(
    group="hydra/sweeper", name="meshrun", node=MeshrunSweeperConf, provider="meshrun"
)


class MeshrunSweeper(BasicSweeper):
    """Hydra's basic sweeper without its ``multirun.yaml``: it would write the
    whole config (before any check) into a sweep dir that a refused sweep
    must not leave behind. Exits with the launcher's code at the end."""

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        params_conf = self._parse_config()
        params_conf.extend(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides(params_conf)
        self.overrides = self.split_arguments(overrides, self.max_batch_size)
        returns: list[Sequence[JobReturn]] = []
        initial_job_idx = 0
        while not self.is_done():
            batch = self.get_job_batch()
            results = self.launcher.launch(batch, initial_job_idx=initial_job_idx)
            for r in results:
                _ = r.return_value  # re-raises an unexpected failure of a point
            initial_job_idx += len(batch)
            returns.append(results)
        code = getattr(self.launcher, "exit_code", 0)
        if code:
            sys.exit(code)
        return returns


def _done(overrides: Sequence[str], value: Any) -> JobReturn:
    return JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED, _return_value=value)


class MeshrunLauncher(Launcher):
    def __init__(self, check: bool = True) -> None:
        self.check = check
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.exit_code = 0
        self.dry_specs: dict[int, Any] = {}  # each planned dry-run point, for the sweep's one table
        self.verbose = False

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        from launcher.config.sweepcompose import install

        # Points that share their config groups are composed once (the
        # sweeper's check and this launcher each composed every point).
        install(hydra_context.config_loader)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from launcher.config.runid import new_run_id
        from launcher.config.spec import RunSpec
        from launcher.run.undo import RunDirUndo

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        t0 = time.monotonic()
        typed_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir = typed_dir.resolve()
        # Names the sweep's job arrays; every point still gets its own run id
        # (launcher/config/runid.py) when its run dir is first written.
        sweep_id = new_run_id("sweep")
        points: dict[int, dict[str, Any]] = {}
        slurm: dict[int, RunSpec] = {}
        here: dict[int, DictConfig] = {}
        self.dry_specs = {}
        self.verbose = bool(OmegaConf.select(self.config, "launcher.verbose", default=False))
        for i, overrides in enumerate(job_overrides):
            num = initial_job_idx + i
            points[num] = self._check_point(num, overrides, sweep_dir, slurm, here)
        remote = {n: spec for n, spec in slurm.items() if spec.cfg.cluster.login}
        if remote and (len(remote) < len(slurm) or here):
            # Sent whole, its other points would run on (or submit from) the login node.
            print(
                "meshrun: error: a sweep whose points go to a cluster behind its login node (cluster.login) "
                "and elsewhere (another cluster, this machine, a dry run): split it into one sweep per cluster",
                file=sys.stderr,
            )
            self.exit_code = 2
            return [_done(o, "invalid") for o in job_overrides]
        if remote:  # the sweep dir is the cluster's path: nothing here looks at this machine's
            return self._over_ssh(job_overrides, next(iter(remote.values())), typed_dir)
        # Nothing accepted: no sweep dir either (the checks above wrote nothing).
        sweep_undo = RunDirUndo(sweep_dir)
        if self._refuse_shared_run_dirs(points):
            slurm.clear()  # nothing is submitted, run or written
            here.clear()
        self._submit(slurm, points, sweep_dir, sweep_id)
        if any(p.get("status") == "to run here" for p in points.values()):
            self._write_manifest(points, sweep_dir, sweep_id)  # visible while the local points run
        table = self._one_table(points)
        for num, sweep_config in here.items():
            if not (table and points[num]["status"] == "dry run"):
                self._run_here(num, sweep_config, points[num])
        self._close(points, sweep_dir, sweep_id, sweep_undo, t0, table)
        return [
            _done(job_overrides[n - initial_job_idx], points[n].get("job_id") or points[n].get("status"))
            for n in sorted(points)
        ]

    def _over_ssh(
        self, job_overrides: Sequence[Sequence[str]], spec: Any, sweep_dir: Path
    ) -> list[JobReturn]:
        """A sweep for a cluster behind its login node (cluster.login): the
        whole sweep, as typed, runs there (launcher/entry/sshsubmit.py), in
        ``<launcher.runs_root>/sweeps/`` unless hydra.sweep.dir names a folder there."""
        from launcher.config.validate import ConfigError
        from launcher.entry.sshsubmit import submit_over_ssh
        from launcher.slurm.remote import RemoteError

        assert self.config is not None
        given = any(str(o).startswith("hydra.sweep.dir=") for o in self.config.hydra.overrides.hydra)
        there = (
            str(sweep_dir) if given else f"{spec.cfg.launcher.runs_root.rstrip('/')}/sweeps/{sweep_dir.name}"
        )
        try:
            self.exit_code = submit_over_ssh(spec, list(self.config.hydra.overrides.task), sweep_dir=there)
        except ConfigError as e:
            print(f"meshrun: error: {e}", file=sys.stderr)
            self.exit_code = 2
        except RemoteError as e:
            print(f"meshrun: error: {e}", file=sys.stderr)
            self.exit_code = 3
        said = "submitted over SSH" if self.exit_code == 0 else "failed"
        return [_done(o, said) for o in job_overrides]

    def _check_point(
        self,
        num: int,
        overrides: Sequence[str],
        sweep_dir: Path,
        slurm: dict[int, Any],
        here: dict[int, DictConfig],
    ) -> dict[str, Any]:
        """One point through the same checks as a single run: its entry in
        the sweep manifest; an accepted point goes to ``slurm`` (its spec) or
        ``here`` (its Hydra config, run through the task function)."""
        from launcher.config.validate import ConfigError
        from launcher.run.prepare import prepare
        from launcher.run.rundir import check_resume
        from launcher.run.runlock import check_slurm_owner
        from launcher.slurm.cluster import SlurmError

        entry: dict[str, Any] = {"point": num, "overrides": list(filter_overrides(overrides))}
        try:
            sweep_config, subdir, cfg = self._compose_point(num, overrides)
            run_dir = cfg.launcher.run_dir or str(sweep_dir / subdir)
            # The same checks as a single run; the spec is reused for Slurm points.
            spec = prepare(copy.deepcopy(cfg), run_dir)
            entry["run_dir"] = spec.run_dir
            if cfg.cluster.kind == "slurm" and not cfg.launcher.dry_run:
                if cfg.cluster.login:  # the whole sweep goes to the login node: checked there
                    slurm[num] = spec
                    return entry
                check_slurm_owner(spec.run_dir)  # reads only, like check_resume
                check_resume(spec)
                slurm[num] = spec
            else:
                with read_write(sweep_config.hydra.runtime), open_dict(sweep_config.hydra.runtime):
                    sweep_config.hydra.runtime.output_dir = spec.run_dir
                here[num] = sweep_config
                entry["status"] = "dry run" if cfg.launcher.dry_run else "to run here"
                if cfg.launcher.dry_run:
                    self.dry_specs[num] = spec
                    self.verbose = self.verbose or cfg.launcher.verbose
        except ConfigError as e:
            entry.update(status="invalid", reason=str(e))
        except SlurmError as e:  # the run dir's previous job could not be looked up
            entry.update(status="failed", reason=str(e))
        return entry

    def _compose_point(self, num: int, overrides: Sequence[str]) -> tuple[DictConfig, str, Any]:
        """(the point's Hydra config, its sweep subdir, its RunConfig). A
        point that does not compose (model=bogus) is one invalid point
        (ConfigError), not the end of the sweep."""
        from omegaconf.errors import OmegaConfBaseException

        from launcher.config.compose import composition_message, to_run_config
        from launcher.config.validate import ConfigError

        assert self.config is not None and self.hydra_context is not None
        try:
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = num
                sweep_config.hydra.job.num = num
            # What set_config does for ${hydra:...} in the point's values,
            # without its copy of the hydra node (a quarter of a point's cost):
            # HydraConfig.get() reads the point's own .hydra. A point run here
            # gets the real set_config (_run_here).
            OmegaConf.set_readonly(sweep_config.hydra, True)
            HydraConfig.instance().cfg = sweep_config  # type: ignore[assignment]
            subdir = str(sweep_config.hydra.sweep.subdir)
            cfg = to_run_config(sweep_config)
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(composition_message(e)) from e
        return sweep_config, subdir, cfg

    def _close(
        self,
        points: dict[int, dict[str, Any]],
        sweep_dir: Path,
        sweep_id: str,
        sweep_undo: Any,
        t0: float,
        table: bool = False,
    ) -> None:
        """The sweep manifest (or nothing, when no point wrote a run dir),
        the summary, and the exit code."""
        from launcher.config.runid import read_run_id

        for entry in points.values():
            run_id = read_run_id(entry["run_dir"]) if entry.get("wrote") else ""
            if run_id:
                entry["run_id"] = run_id
        if any(p.get("wrote") for p in points.values()):
            self._write_manifest(points, sweep_dir, sweep_id)
        else:
            sweep_undo.undo()  # only refusals, failed submissions or dry runs: leave nothing
        if table:
            self._print_table(points)
        self._report(points, sweep_dir, time.monotonic() - t0, table)
        statuses = [p.get("status") for p in points.values()]
        if all(s == "invalid" for s in statuses):
            self.exit_code = 2
        elif "failed" in statuses:
            self.exit_code = 3

    @staticmethod
    def _refuse_shared_run_dirs(points: dict[int, dict[str, Any]]) -> bool:
        """One owner per run dir: points that would share one (the same
        ``launcher.run_dir`` given to several) would write one spec.json, share
        one run id and S3 prefix, and prune each other. The whole sweep is
        refused before anything is submitted or written; True when refused."""
        by_dir: dict[str, list[int]] = {}
        for num, entry in points.items():
            if entry.get("run_dir") and entry.get("status") != "invalid":
                by_dir.setdefault(str(Path(entry["run_dir"]).resolve()), []).append(num)
        shared = {d: nums for d, nums in by_dir.items() if len(nums) > 1}
        if not shared:
            return False
        why = "; ".join(
            f"points {', '.join(f'#{n}' for n in nums)} share launcher.run_dir={d!r}"
            for d, nums in shared.items()
        )
        for num, entry in points.items():
            if entry.get("status") == "invalid":
                continue
            mine = any(num in nums for nums in shared.values())
            reason = (
                f"{why}: a run dir has one owner; give each point its own launcher.run_dir "
                "(or leave it unset: <sweep dir>/<point>)"
                if mine
                else f"not started: the sweep was refused ({why})"
            )
            entry.update(status="invalid", reason=reason)
        return True

    def _run_here(self, num: int, sweep_config: DictConfig, entry: dict[str, Any]) -> None:
        """A local or dry-run point, through the task function (no Hydra run
        dir: the task writes its run dir itself, once accepted)."""
        assert self.task_function is not None
        HydraConfig.instance().set_config(sweep_config)
        task_cfg = copy.deepcopy(sweep_config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        code = self.task_function(task_cfg)
        if entry["status"] == "dry run":
            if code:
                entry.update(status="invalid", reason=f"exit code {code} (see above)")
            return
        # Exit code 2: refused before anything was written; otherwise the run dir holds its logs.
        entry["wrote"] = code != 2
        if code:
            entry.update(status="invalid" if code == 2 else "failed", reason=f"exit code {code} (see above)")
        else:
            entry["status"] = "ran here"

    def _submit(
        self,
        specs: dict[int, Any],
        points: dict[int, dict[str, Any]],
        sweep_dir: Path,
        sweep_id: str,
        extra: dict[str, str] | None = None,
    ) -> None:
        """One job array per same-request group, each through the one submission
        sequence (launcher/run/submission.py); ``extra``: meshrun_slurm's checked
        sbatch options."""
        from launcher.config.validate import ConfigError
        from launcher.run.submission import SubmissionFailed, submit_runs
        from launcher.slurm.cluster import SlurmError
        from launcher.slurm.submit import array_key

        groups: dict[str, list[int]] = {}
        for num, spec in specs.items():
            groups.setdefault(array_key(spec), []).append(num)
        for g, nums in enumerate(groups.values()):
            try:
                job_id = submit_runs(
                    [specs[n] for n in nums],
                    [points[n]["overrides"] for n in nums],
                    array_dir=sweep_dir / "slurm",
                    job_name=sweep_id,
                    extra=extra,
                    check=self.check,
                ).job_id
            except ConfigError as e:
                for n in nums:
                    points[n].update(status="invalid", reason=f"{e} (nothing submitted)")
                continue
            except SubmissionFailed as e:
                for n in nums:
                    points[n].update(
                        status="failed", reason=f"{e.__cause__ or e} (run dir removed, nothing submitted)"
                    )
                continue
            except SlurmError as e:
                for n in nums:
                    points[n].update(status="failed", reason=f"{e} (nothing submitted)")
                continue
            for i, n in enumerate(nums):
                points[n].update(
                    status="submitted", job_id=f"{job_id}_{i}", array=job_id, array_group=g, wrote=True
                )

    @staticmethod
    def _write_manifest(points: dict[int, dict[str, Any]], sweep_dir: Path, sweep_id: str) -> None:
        manifest = {
            "sweep_id": sweep_id,
            "sweep_dir": str(sweep_dir),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "points": [{k: v for k, v in points[n].items() if k != "wrote"} for n in sorted(points)],
        }
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")

    def _one_table(self, points: dict[int, dict[str, Any]]) -> bool:
        """A dry-run sweep (every point a dry run or refused) prints one table
        instead of every point's plan, unless launcher.verbose (-v) asks for them."""
        statuses = {p.get("status") for p in points.values()}
        dry = "dry run" in statuses or bool(OmegaConf.select(self.config, "launcher.dry_run", default=False))
        return dry and statuses <= {"dry run", "invalid"} and not self.verbose

    def _print_table(self, points: dict[int, dict[str, Any]]) -> None:
        from launcher.slurm.cluster import slurm_reachable
        from launcher.views.sweepdry import DryPoint, dry_run_table, gather

        rows = [
            DryPoint(n, points[n]["overrides"], self.dry_specs.get(n), points[n].get("reason", ""))
            for n in sorted(points)
        ]
        gather(rows, slurm_reachable())
        print("\n".join(dry_run_table(rows)))
        if self.dry_specs:
            print("meshrun: every point's plan and sbatch script: the same command with -v")

    @staticmethod
    def _report(
        points: dict[int, dict[str, Any]], sweep_dir: Path, seconds: float, table: bool = False
    ) -> None:
        def count(status: str) -> int:
            return sum(p.get("status") == status for p in points.values())

        arrays = sorted({p["array"] for p in points.values() if p.get("status") == "submitted"})
        said: dict[str, int] = {}  # a reason shared by many points (one Slurm refusal): said once
        for p in [] if table else points.values():  # the table said each point
            what = p.get("job_id") or p.get("status")
            print(f"meshrun: #{p['point']} {' '.join(p['overrides'])}: {what}")
            reason = p.get("reason")
            if reason and reason in said:
                print(f"meshrun:     {p['status']}: the same reason as #{said[reason]}")
            elif reason:
                said[reason] = p["point"]
                print(f"meshrun:     {p['status']}: {reason}")
        print(
            f"meshrun: sweep of {len(points)}: {count('submitted')} submitted in {len(arrays)} job array(s)"
            f"{' ' + ', '.join(arrays) if arrays else ''}; {count('ran here')} ran here; "
            f"{count('dry run')} dry run; {count('invalid')} invalid; {count('failed')} failed; {seconds:.1f} s"
        )
        if (sweep_dir / MANIFEST).exists():
            print(
                f"meshrun: manifest {sweep_dir / MANIFEST}  (status: python -m launcher.status {sweep_dir})"
            )
        else:
            print("meshrun: nothing was written or submitted")
