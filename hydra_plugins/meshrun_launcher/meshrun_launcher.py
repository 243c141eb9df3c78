"""Hydra Launcher for ``python -m launcher -m ...`` sweeps: plan every point,
report the invalid ones with their reason, submit the valid Slurm points as
job arrays (one per distinct resource request) and return at once, writing
``<sweep dir>/manifest.json`` (point, overrides, job id, run dir, reason).

Points on ``cluster=local`` and dry runs go through the normal task function
one after another, as Hydra's basic launcher would.
"""

# No `from __future__ import annotations`: Hydra scans plugins without
# registering the module, and dataclasses then cannot resolve string types.

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"


@dataclass
class MeshrunLauncherConf:
    _target_: str = "hydra_plugins.meshrun_launcher.meshrun_launcher.MeshrunLauncher"
    # Check partition / qos / account against the live cluster before submitting.
    check: bool = True


ConfigStore.instance().store(
    group="hydra/launcher", name="meshrun", node=MeshrunLauncherConf, provider="meshrun"
)


def _done(overrides: Sequence[str], value: Any) -> JobReturn:
    ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED, _return_value=value)
    return ret


class MeshrunLauncher(Launcher):
    def __init__(self, check: bool = True) -> None:
        self.check = check
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from launcher import nccl
        from launcher.compose import to_run_config
        from launcher.fit import fit_to_qos_share
        from launcher.plan import make_plan
        from launcher.rundir import check_resume
        from launcher.runid import new_run_id, read_run_id
        from launcher.runlock import check_slurm_owner
        from launcher.slurm import SlurmUnavailable
        from launcher.spec import RunSpec
        from launcher.validate import ConfigError

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        t0 = time.monotonic()
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        # Names the sweep's job arrays; every point still gets its own run id
        # (launcher/runid.py) when its run dir is first written.
        sweep_id = new_run_id("sweep")
        returns: dict[int, JobReturn] = {}
        points: dict[int, dict[str, Any]] = {}
        slurm: dict[int, RunSpec] = {}
        for i, overrides in enumerate(job_overrides):
            num = initial_job_idx + i
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = num
                sweep_config.hydra.job.num = num
            HydraConfig.instance().set_config(sweep_config)
            subdir = str(sweep_config.hydra.sweep.subdir)
            entry: dict[str, Any] = {"point": num, "overrides": list(filter_overrides(overrides))}
            points[num] = entry
            try:
                cfg = to_run_config(sweep_config)
                if cfg.cluster.kind != "slurm" or cfg.launcher.dry_run:
                    entry["run_dir"] = str(sweep_dir / subdir)
                    returns[num] = run_job(
                        hydra_context=self.hydra_context,
                        task_function=self.task_function,
                        config=sweep_config,
                        job_dir_key="hydra.sweep.dir",
                        job_subdir_key="hydra.sweep.subdir",
                    )
                    entry["status"] = "ran here"
                    continue
                note = fit_to_qos_share(cfg, overrides)
                if note:
                    entry["note"] = note
                nccl.apply(cfg.cluster)
                run_dir = str(Path(cfg.launcher.run_dir or sweep_dir / subdir).resolve())
                spec = RunSpec(cfg, make_plan(cfg), run_dir)
                check_slurm_owner(run_dir)
                check_resume(spec)
                slurm[num] = spec
                entry["run_dir"] = run_dir
            except (ConfigError, SlurmUnavailable) as e:
                entry.update(status="invalid", reason=str(e))
                returns[num] = _done(overrides, f"invalid: {e}")
        self._submit(slurm, points, sweep_dir, sweep_id)
        for num, entry in points.items():
            if num not in returns:
                returns[num] = _done(
                    job_overrides[num - initial_job_idx], entry.get("job_id") or entry.get("reason")
                )
        for entry in points.values():
            run_id = read_run_id(entry["run_dir"]) if entry.get("run_dir") else ""
            if run_id:
                entry["run_id"] = run_id
        manifest = {
            "sweep_id": sweep_id,
            "sweep_dir": str(sweep_dir),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "points": [points[n] for n in sorted(points)],
        }
        (sweep_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        self._report(points, sweep_dir, time.monotonic() - t0)
        return [returns[n] for n in sorted(returns)]

    def _submit(
        self, specs: dict[int, Any], points: dict[int, dict[str, Any]], sweep_dir: Path, sweep_id: str
    ) -> None:
        from launcher.container import check_image
        from launcher.rundir import write_run_dir
        from launcher.slurm import SlurmUnavailable, check_request
        from launcher.submit import array_key, submit_array
        from launcher.validate import ConfigError

        groups: dict[str, list[int]] = {}
        for num, spec in specs.items():
            groups.setdefault(array_key(spec), []).append(num)
        for g, nums in enumerate(groups.values()):
            group = [specs[n] for n in nums]
            try:
                check_image(group[0].cfg.cluster.container_image)  # before any run dir is written
                if self.check:
                    check_request(group[0])  # the request is the same for every point of the group
                for spec in group:
                    write_run_dir(spec)
                job_id = submit_array(group, sweep_dir / "slurm", check=False, job_name=sweep_id)
            except (ConfigError, SlurmUnavailable) as e:
                for n in nums:
                    points[n].update(status="invalid", reason=str(e))
                continue
            for i, n in enumerate(nums):
                points[n].update(status="submitted", job_id=f"{job_id}_{i}", array=job_id, array_group=g)

    @staticmethod
    def _report(points: dict[int, dict[str, Any]], sweep_dir: Path, seconds: float) -> None:
        submitted = [p for p in points.values() if p.get("status") == "submitted"]
        invalid = [p for p in points.values() if p.get("status") == "invalid"]
        arrays = sorted({p["array"] for p in submitted})
        for p in points.values():
            what = p.get("job_id") or p.get("status")
            print(f"meshrun: #{p['point']} {' '.join(p['overrides'])}: {what}")
            if p.get("status") == "invalid":
                print(f"meshrun:     not submitted: {p['reason']}")
        print(
            f"meshrun: sweep: {len(submitted)} submitted in {len(arrays)} job array(s) "
            f"{', '.join(arrays)}; {len(invalid)} invalid; {seconds:.1f} s"
        )
        print(f"meshrun: manifest {sweep_dir / MANIFEST}  (status: python -m launcher.status {sweep_dir})")
