"""``hydra/launcher=meshrun_slurm``: the config of the launcher for any Hydra
app (hydra_plugins/meshrun_slurm/launcher.py). Keys that
hydra-submitit-launcher's ``submitit_slurm`` has keep their names and
meanings (docs/hydra-launcher.md has the table: kept, added, not applicable);
the added ones are meshrun's."""

# No `from __future__ import annotations`: Hydra scans plugins without
# registering the module, and dataclasses then cannot resolve string types.

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class MeshrunSlurmConf:
    _target_: str = "hydra_plugins.meshrun_slurm.launcher.MeshrunSlurmLauncher"
    # --- hydra-submitit-launcher's keys (same names, same meanings); None: the preset's value
    timeout_min: int | None = None  # sbatch --time (meshrun: qos.time_limit_min)
    cpus_per_task: int | None = None  # launcher.cpus_per_task
    # cluster.gpus_per_node: one task per GPU; 0 (submitit's unset): CPU work, one task.
    gpus_per_node: int = 0
    # Must equal the tasks meshrun starts per node (one per GPU; CPU work and local: 1).
    tasks_per_node: int | None = None
    mem_gb: int | None = None  # launcher.mem_gb
    nodes: int = 1  # cluster.nodes (submitit's default, not the preset's)
    name: str = "${hydra.job.name}"  # the Slurm job name (launcher.job_name)
    partition: str | None = None  # qos.partition
    qos: str | None = None  # the Slurm QOS (qos.qos)
    account: str | None = None  # qos.account
    constraint: str | None = None  # sbatch --constraint
    # comment, gres, cpus_per_gpu, gpus_per_task, mem_per_gpu, mem_per_cpu: meshrun
    # sets --comment, --gres, --cpus-per-task and --mem itself (not applicable).
    signal_delay_s: int | None = None  # USR2 this long before the time limit (launcher.signal_lead_s)
    additional_parameters: dict[str, Any] = field(default_factory=dict)  # more sbatch options
    # --- meshrun's
    # The cluster preset (conf/cluster/): resources, NCCL preset (its fabric),
    # Pyxis; local: every point runs on this machine, one after another.
    cluster: str = "local"
    qos_preset: str = "research"  # the QOS preset (conf/qos/): partition, QOS, account, time
    container_image: str | None = None  # Pyxis image (cluster.container_image)
    preflight: bool | None = None  # node checks before the task (cluster.preflight)
    max_restarts: int | None = None  # reruns after failures (launcher.max_restarts)
    # The cluster's login node, user@host[:port] (cluster.login): the sweep is
    # submitted there over SSH from a machine without Slurm (wait=false only).
    login: str | None = None
    # The task function's output is the app's own: a step regex for hang
    # detection and progress (job.progress_regex); empty: liveness only.
    progress_regex: str = ""
    # Any other meshrun field, as on meshrun's command line, each quoted for
    # Hydra's grammar ('=' needs quotes): overrides='["launcher.exclusive=true"]'.
    # Points share the node (launcher.exclusive=false, CPUs and memory in
    # proportion) and run from a code snapshot (launcher.code=snapshot) unless these say otherwise.
    overrides: list[str] = field(default_factory=list)
    # false: submit the sweep (one job array) and return at once, each point's
    # JobReturn COMPLETED with meshrun's run handle (launcher.api.Run) as its
    # value; BasicSweeper only (a sweeper that reads results needs them).
    wait: bool = True
    # Seconds between checks of a submitted sweep's jobs while the launch waits.
    poll_s: float = 2.0


ConfigStore.instance().store(
    group="hydra/launcher", name="meshrun_slurm", node=MeshrunSlurmConf, provider="meshrun"
)
