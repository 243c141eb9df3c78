"""Typed schema of a meshrun run: one dataclass per Hydra config group.

Standard library only: the training side (``train/``) receives these objects
and must never import Hydra, and importing the launcher must stay free of
torch. YAML files under ``conf/`` only set values; registration with Hydra's
ConfigStore lives in :mod:`launcher.config.configstore`.

Units are in the field names (``_gb``, ``_gb_per_s`` = gigabytes/s,
``_gbit_per_s`` = gigabits/s, ``_min``, ``_s``, ``_usd``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

ClusterKind = Literal["local", "slurm"]
# Where ranks compute: "auto" = CUDA wherever GPUs are planned; "cpu" = CPU
# ranks with gloo even on a Slurm cluster whose GPUs are GRES placeholders
# (the local test cluster, scripts/testcluster.sh).
ComputeDevice = Literal["auto", "cpu"]
Fabric = Literal["none", "nvlink_only", "ib_hdr", "ib_ndr", "roce_v2", "efa", "tcp"]
IntraNodeLink = Literal["nvlink", "pcie", "none"]
ParallelMode = Literal["auto", "fsdp", "hsdp", "fsdp_tp", "fsdp_tp_pp"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "zbv"]
ActivationCheckpointing = Literal["auto", "none", "selective", "full"]
Precision = Literal["auto", "fp32", "bf16"]
# Float8 training of the block linears (torchao.float8, docs/speed.md):
# tensorwise = one scale per tensor (FSDP2 all-gathers the weights in
# float8); rowwise = one scale per row (more accurate, a little slower).
Float8Recipe = Literal["off", "tensorwise", "rowwise"]
DataKind = Literal["synthetic", "tokens", "images"]
ModelFamily = Literal["llama", "vit"]
BadSamplePolicy = Literal["skip", "fail"]
ImageDtype = Literal["auto", "fp32", "fp16"]
JobKind = Literal["pretrain", "finetune", "eval", "generate", "script"]
# job=script: one Slurm task per GPU (torchrun-style env), or torchrun per node.
ScriptLaunch = Literal["tasks", "torchrun"]
WandbMode = Literal["off", "online", "offline"]
# Host syncs of the training loop (train/observe/hostsync.py): count them in each
# logged step's metrics, or fail a step that logs nothing at its first.
HostSyncCheck = Literal["off", "count", "raise"]
# Reusing a run dir: "auto" resumes it and refuses a changed training config
# (launcher/config/spec.py: training_config); "force" resumes with the change;
# "local_only" is "auto" that also resumes when a remote checkpoint tier
# (storage.shared_dir, S3) cannot be listed, from what is known without it
# (otherwise such a start fails, naming the tier).
ResumeMode = Literal["auto", "force", "local_only"]
# What the supervisor does with a straggler (launcher/selfheal/straggler.py):
# "warn" records it (faults.jsonl, the ledger, Prometheus); "replace" also
# swaps its node for a spare at a checkpoint boundary; "off": no probes.
StragglerPolicy = Literal["warn", "replace", "off"]
# Where a run's S3 credentials come from (docs/security.md): "auto" = the file
# when storage.s3_credentials_file is set, else the environment on
# cluster=local (a Slurm run must name a source); "file" = that file; "role" =
# the node's instance / IAM role (nothing passed); "env" = the environment of
# the shell that runs meshrun, cluster=local only (Slurm would store it).
S3Credentials = Literal["auto", "file", "role", "env"]
CodeMode = Literal["snapshot", "live", "clean"]


def choice(default: str, alias: Any) -> Any:
    """A mode field: stored as ``str`` (OmegaConf has no Literal support),
    its valid values kept in metadata for :func:`launcher.config.validate`."""
    choices = get_args(alias)
    assert default in choices, (default, choices)
    return field(default=default, metadata={"choices": choices})


@dataclass
class ClusterConfig:
    """Where the run executes: this machine (``local``) or a Slurm cluster."""

    name: str = "local"  # the preset's name (shown in run names and plans)
    kind: str = choice("local", ClusterKind)  # local: ranks on this machine; slurm: sbatch
    # The cluster's login node, reached over the user's own ssh from a machine
    # without Slurm: user@host, user@host:port or host (an ssh config alias
    # too). Empty: Slurm's commands run on this machine (docs/your-cluster.md).
    login: str = ""
    # The Python on the login node that runs meshrun from the shipped code
    # when a run is submitted over SSH (cluster.login): it needs meshrun's
    # packages (hydra-core, omegaconf); a name on the login node's PATH or a path.
    python: str = "python3"
    device: str = choice("auto", ComputeDevice)
    nodes: int = 1  # nodes the job asks for (never shrunk)
    # Nodes of the whole cluster, when the preset asks for fewer: only for the
    # QOS share a dry run estimates where Slurm cannot be asked
    # (launcher/plan/qosshare.py). 0: the cluster is cluster.nodes big.
    cluster_nodes: int = 0
    # GPUs per node. For kind=local, 0 means "use local_processes CPU ranks".
    gpus_per_node: int = 0
    # GPUs the node has, when gpus_per_node asks fewer (a shared node:
    # launcher.exclusive=false asks CPUs and memory in this proportion). 0: gpus_per_node.
    node_gpus: int = 0
    # Ranks started on this machine when kind=local and there are no GPUs.
    local_processes: int = 2
    gpu_type: str = "cpu"  # GPU model, e.g. h100 (cpu: none)
    gpu_mem_gb: float = 0.0  # HBM per GPU
    # HBM the planner leaves free per GPU for the CUDA context, NCCL buffers
    # and allocator fragmentation. 0: per gpu_type from conf/perf/default.yaml
    # (hbm_reserve_gb + hbm_fragmentation x gpu_mem_gb).
    gpu_mem_reserve_gb: float = 0.0
    # Dense bf16 peak of one GPU, for MFU and the performance model.
    gpu_peak_bf16_tflops: float = 0.0
    intra_node_link: str = choice("none", IntraNodeLink)  # GPU-to-GPU link inside a node
    intra_node_bandwidth_gb_per_s: float = 0.0  # per GPU, both directions (NVLink 4: 900)
    fabric: str = choice("none", Fabric)  # inter-node network: picks the NCCL preset
    fabric_adapters_per_node: int = 0  # NICs per node used by NCCL
    fabric_adapter_gbit_per_s: float = 0.0  # line rate of one NIC
    cpus_per_node: int = 2  # CPU cores per node
    mem_per_node_gb: float = 24.0  # host RAM per node
    scratch_path: str = "/tmp"  # node-local scratch directory
    scratch_tb: float = 0.0  # its size (0: unknown)
    # Pyxis/Enroot: an empty image means no container.
    container_image: str = ""
    container_mounts: list[str] = field(default_factory=list)  # extra SRC:DST mounts (datasets, scratch)
    container_workdir: str = ""  # checkout's path inside the image
    container_python: str = "python"  # Python inside the image
    # Does the cluster's srun accept --container-image (Pyxis installed)?
    pyxis: bool = False
    # Environment exported into every task, over the fabric's NCCL preset
    # (launcher/nccl.py); an empty value unsets a preset variable.
    env: dict[str, str] = field(default_factory=dict)
    # Extra nodes allocated beside the plan's, idle until a node is set aside
    # after a fault: the batch-level supervisor (launcher/selfheal/supervisor.py)
    # then restarts the tasks on a spare inside the same allocation.
    spare_nodes: int = 0
    # Preflight (launcher/preflight.py): runs before training on every node.
    preflight: bool = True
    # All-reduce bus bandwidth the fabric should reach; 0: from the preset.
    expected_busbw_gb_per_s: float = 0.0
    # Message size of the preflight all-reduce; 0: 512 MB on GPUs, 16 MB on CPU.
    preflight_allreduce_mb: float = 0.0
    # Free scratch space required beyond 2x the dataset plus checkpoints.
    preflight_min_free_gb: float = 0.0
    # Each rank's Prometheus exporter listens on metrics_port + local rank;
    # 0 disables the exporters.
    metrics_port: int = 9410
    # Time in collectives: the profiler on for one training step every N metric
    # updates, its trace read off the loop thread (0: off).
    metrics_comm_sample_every: int = 10
    # Dated price defaults (public Q2 2026 list prices), per node.
    price_date: str = "2026-Q2"
    price_on_demand_usd_per_node_hour: float = 0.0  # 0: no price
    price_reserved_usd_per_node_year: float = 0.0  # 0: no price
    price_onprem_tco_usd_per_node_3yr: float = 0.0  # 0: no price
    # This site's GPU-hours between failures, the prior of the failure rate
    # that the save interval and the forecasts use (launcher/perf/reliability.py)
    # before the runs root's own history outweighs it. 0: Meta's published
    # figure, 7.9 h MTTF at 1,024 GPUs (8,090 GPU-h).
    gpu_h_per_failure: float = 0.0


@dataclass
class ModelConfig:
    """Model shape. Llama-style decoder unless family=vit."""

    name: str = "tiny"  # the preset's name
    family: str = choice("llama", ModelFamily)  # llama decoder or vit classifier
    dim: int = 64  # hidden size
    n_layers: int = 4  # transformer blocks
    n_heads: int = 4  # attention heads
    n_kv_heads: int = 2  # key/value heads (grouped-query attention)
    ffn_dim: int = 192  # MLP hidden size
    vocab_size: int = 256  # tokens in the vocabulary
    seq_len: int = 64  # tokens per training sequence
    norm_eps: float = 1e-5  # RMSNorm epsilon
    rope_theta: float = 10000.0  # RoPE base frequency
    # Llama 3.1-style RoPE frequency scaling (rope_type "llama3" in a Hugging
    # Face config.json); factor 0: none.
    rope_scaling_factor: float = 0.0
    rope_low_freq_factor: float = 1.0  # llama3 RoPE scaling
    rope_high_freq_factor: float = 4.0  # llama3 RoPE scaling
    rope_original_max_positions: int = 8192  # llama3 RoPE scaling
    # ViT only.
    image_size: int = 224
    patch_size: int = 16  # ViT patch side in pixels
    num_classes: int = 1000  # ViT classifier outputs


@dataclass
class ParallelismConfig:
    """Parallel layout. A degree of 0 lets the planner choose it."""

    name: str = "auto"  # the preset's name
    mode: str = choice("auto", ParallelMode)  # auto: the planner picks the layout
    dp_replicate: int = 0  # HSDP replicas (across nodes)
    dp_shard: int = 0  # FSDP shard group size
    tp: int = 0  # tensor-parallel degree (inside a node)
    pp: int = 0  # pipeline stages
    # Context parallel: ranks that split each sequence (ring attention,
    # torch's context_parallel; CUDA only). 0: the planner chooses (1 unless
    # memory needs more), 1: off.
    cp: int = 0
    pp_schedule: str = choice("1f1b", PipelineSchedule)  # pipeline schedule
    # Microbatches per step for pipeline parallelism (0: 2 x pp).
    pp_microbatches: int = 0
    # Pipeline stages per rank (>1 for interleaved / zero-bubble schedules).
    stages_per_rank: int = 1
    # auto: the least recompute whose activations fit in GPU memory.
    activation_checkpointing: str = choice("auto", ActivationCheckpointing)
    compile: bool = False  # torch.compile each block
    # auto: bf16 params + fp32 reduce on GPUs, fp32 on CPU.
    precision: str = choice("auto", Precision)
    # Never offload parameters (guidance); kept as a field so a user who sets
    # it gets a clear refusal instead of silent acceptance.
    offload_params: bool = False


@dataclass
class StorageConfig:
    """Checkpoint tiers: node-local NVMe, optional shared FS, optional S3."""

    name: str = "local"  # the preset's name
    # Tier 1: node-local path; empty means <run_dir>/checkpoints.
    local_dir: str = ""
    # Tier 2: shared filesystem copy (Lustre, NFS); empty disables it.
    shared_dir: str = ""
    # Tier 3: S3-compatible object store; required by the *_s3 presets.
    s3_required: bool = False
    s3_bucket: str = ""  # bucket name only (no s3://); empty: no S3 tier
    s3_prefix: str = "meshrun"  # key prefix; the run id goes under it
    s3_endpoint_url: str = ""  # http(s) URL of a non-AWS store (MinIO); empty: AWS
    s3_region: str = "us-east-1"  # the bucket's region
    s3_credentials: str = choice("auto", S3Credentials)  # where jobs get S3 keys (never the job env)
    # An AWS shared credentials file (absolute path, not world-readable):
    # mounted read-only into containers and named by
    # AWS_SHARED_CREDENTIALS_FILE in every task (AWS_PROFILE picks a profile).
    s3_credentials_file: str = ""
    # Steps between saves (>= 1), or "auto": Young/Daly from the measured
    # save cost and the failure rate (launcher/config/saveauto.py).
    save_every_steps: Any = 25
    save_every_min: float = 0.0  # 0: no time-based saves
    keep_local: int = 2  # newest copies kept in tier 1
    keep_remote: int = 3  # newest copies kept in the remote tiers
    async_save: bool = True  # save off the training loop
    upload_timeout_min: float = 10.0  # one checkpoint's upload
    # Background upload: concurrent parts/files, multipart part size (S3
    # minimum 5), and the longest wait between retries while S3 is down.
    upload_threads: int = 8
    upload_part_mb: int = 64  # multipart part size (S3 minimum 5)
    upload_retry_max_s: float = 60.0  # longest wait between retries
    # Node 0 commits a remote copy once every node has uploaded its part; a
    # node missing for this long (lost, or its uploads failing) ends that
    # step's upload with an error, keeping the local copies.
    upload_marker_timeout_s: float = 600.0
    # Saves failing in a row (staging, write, commit) before the run stops
    # with an error instead of training unprotected; 0: never stop.
    max_failed_saves: int = 2
    # A checkpoint worker that makes no progress (no chunk written, no phase
    # of the save finished) for this long fails the save and the run.
    worker_stall_timeout_s: float = 600.0


@dataclass
class QosConfig:
    """A team's Slurm partition preset."""

    name: str = "research"  # the preset's name
    partition: str = "research"  # Slurm partition (sbatch --partition)
    qos: str = "research"  # Slurm QOS (sbatch --qos)
    account: str = "research"  # Slurm account (sbatch --account)
    time_limit_min: int = 1440  # sbatch --time
    cluster_share_pct: float = 40.0  # the team's share of the cluster's GPUs
    priority: int = 10  # QOS priority (admin rendering)
    # QOS names this one may preempt.
    preempts: list[str] = field(default_factory=list)
    grace_time_s: int = 120  # a preempted job's time to checkpoint


@dataclass
class DataConfig:
    name: str = "synthetic"  # the preset's name
    kind: str = choice("synthetic", DataKind)  # synthetic tokens, token files, or image folders
    path: str = ""  # dataset directory (tokens, images)
    num_workers: int = 2  # loader workers per rank
    shuffle: bool = True  # shuffle the sample order
    # Use DALI when installed; fall back to a torch DataLoader otherwise.
    use_dali: bool = True
    # Images that fail to decode: skip with a warning, or fail the run.
    on_bad_sample: str = choice("skip", BadSamplePolicy)
    # Skipped images allowed per rank before the run fails (a wrong path or
    # a broken copy shows up as many).
    bad_sample_limit: int = 100
    # Random resized crop + horizontal flip for images (off: whole image).
    augment: bool = True
    # Image batch dtype: auto = fp16 on GPUs, fp32 on CPU.
    image_dtype: str = choice("auto", ImageDtype)


@dataclass
class JobConfig:
    """What the run does (launcher/plan/jobs.py checks it, train/jobs/entry.py
    dispatches on ``kind``). Paths are local: nothing is downloaded."""

    name: str = "pretrain"  # the preset's name
    kind: str = choice("pretrain", JobKind)  # what the run does
    # A Hugging Face Llama directory (config.json + *.safetensors) to start
    # from; its config.json sets the model shape. Empty: no HF weights.
    hf_path: str = ""
    # A meshrun run dir (its newest checkpoint) or one checkpoint dir
    # (.../checkpoints/step_N) to start from (finetune, generate) or to
    # evaluate (eval). Empty: hf_path (or random init for pretrain).
    checkpoint: str = ""
    # eval with a run dir in `checkpoint`: every complete checkpoint of the
    # run (true) or only the newest (false).
    all_checkpoints: bool = True
    # eval: batches of train.global_batch_size sequences (0: one pass over
    # data.path, the tail that fills no batch dropped).
    eval_batches: int = 0
    # finetune: after the last step, also write the weights here in Hugging
    # Face format (config.json + model.safetensors). Empty: don't.
    export_hf: str = ""
    # generate: JSONL input, one {"prompt": "..."} object per line ("id"
    # optional, copied to the output).
    prompts: str = ""
    # generate: JSONL output; empty: <run_dir>/completions.jsonl.
    output: str = ""
    # generate: tokenizer.json (tokenizers library); empty: <hf_path>/tokenizer.json.
    tokenizer: str = ""
    max_new_tokens: int = 64  # generate: tokens per completion
    # 0: greedy; > 0: sampling at this temperature, within top_p.
    temperature: float = 0.0
    top_p: float = 1.0  # generate: nucleus sampling
    # Prompts decoded together per rank (one KV cache).
    batch_size: int = 8
    # End-of-sequence token ids; empty: config.json's eos_token_id.
    eos_token_ids: list[int] = field(default_factory=list)
    # Slurm job-array tasks sharing the prompts (each task: its ranks' share).
    array_tasks: int = 1
    # job=script (docs/your-code.md): a team's own training program, run by
    # launcher/taskwrap/wrapper.py in every task; set script or module, not both.
    script: str = ""  # the program's file (python FILE)
    module: str = ""  # or its module (python -m NAME)
    args: list[str] = field(default_factory=list)  # passed verbatim (no shell)
    # Interpreter; empty: cluster.container_python with an image, else this one.
    python: str = ""
    # Working directory (packed with the code snapshot); empty: the script's
    # project root (nearest parent with .git or pyproject.toml), else its dir.
    workdir: str = ""
    # tasks: one task per GPU with RANK/WORLD_SIZE/MASTER_ADDR...; torchrun:
    # one task per node running torch.distributed.run (c10d on the first node).
    launch: str = choice("tasks", ScriptLaunch)
    stop_signal: str = "SIGTERM"  # sent to the program at preemption / time limit
    # A step number in the program's output (the first group that matched):
    # "step 12", "iter=12", or the training bar's "12/500 [" or "12/? [": a tqdm
    # bar with no description (HF Trainer) or Lightning's "Epoch N:" /
    # "Training:"; others (datasets' "Map:", Lightning's "Validation
    # DataLoader 0:") and the first draw, "0/500 [", are no step done; empty: no parsing.
    progress_regex: str = (
        r"(?i)\b(?:step|iter(?:ation)?)\s*[:=]?\s*(\d+)"
        r"|^\s*(?:(?:Epoch \d+|Training):\s*)?(?:\d+%)?[|](?:[^|]*[|])?\s*([1-9]\d*)/(?:\d+|\?) \["
    )
    elastic: bool = False  # changing membership: not supported (restarts are meshrun's)
    # For a program that resumes only when told where (an HF Trainer script:
    # --resume_from_checkpoint PATH): a glob of its checkpoints, relative to
    # where it starts or absolute, and the arguments added to job.args at a
    # start where it matches, {path} the newest match (natural order of its
    # numbers: checkpoint-10 after checkpoint-9), {dir} that match's folder.
    resume_from: str = ""
    resume_args: list[str] = field(default_factory=list)  # e.g. [--resume_from_checkpoint,"{dir}"]
    # job=script: the program's steps to do, for status and fleet (STEP n/total,
    # the finish forecast); 0: unknown (a tqdm bar's n/total when its records carry one).
    total_steps: int = 0


@dataclass
class TrainConfig:
    """Optimisation settings; not a config group (override as train.*)."""

    steps: int = 40  # optimizer steps
    # Sequences per optimizer step; 0: the smallest multiple of dp >= 8.
    global_batch_size: int = 0
    micro_batch_size: int = 0  # 0: global_batch_size / dp (no accumulation)
    lr: float = 3e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # cosine floor, as a share of lr
    warmup_steps: int = 5  # linear warmup
    weight_decay: float = 0.1  # AdamW weight decay
    grad_clip: float = 1.0  # max gradient norm
    seed: int = 1234  # initialisation and data order
    log_every_steps: int = 5  # step lines and metrics.jsonl rows
    # Count host syncs a step (``host_syncs`` in metrics.jsonl) or fail a
    # non-logging step that reads a device value (train/observe/hostsync.py).
    host_sync_check: str = choice("off", HostSyncCheck)
    # Float8 linears (torchao; pip install 'meshrun[float8]'): FP8 tensor
    # cores (H100 and newer); emulated on CPU ranks, for tests.
    float8: str = choice("off", Float8Recipe)
    # Tokens to train for cost estimates; 0 means steps x batch x seq_len.
    target_tokens: float = 0.0
    # Save a checkpoint after the last step (benchmarks and layout checks turn
    # it off: they measure steps, not a multi-GB write).
    checkpoint_at_end: bool = True
    # Run tracking on rank 0 (train/observe/tracking.py): TensorBoard event files in
    # <run_dir>/tensorboard/.
    tensorboard: bool = True
    # Weights & Biases: off; online (needs `wandb login` or WANDB_API_KEY);
    # offline (writes <run_dir>/wandb/, upload later with `wandb sync`).
    wandb: str = choice("off", WandbMode)
    wandb_project: str = "meshrun"  # W&B project
    wandb_entity: str = ""  # empty: your default W&B entity


@dataclass
class LauncherConfig:
    """How the run is started (not a config group; override as launcher.*)."""

    dry_run: bool = False  # plan and render, submit nothing
    # A sweep's dry run (-m ... launcher.dry_run=true) prints one table, a row
    # per point; true (or -v on the command line): every point's full plan and
    # sbatch script instead.
    verbose: bool = False
    # Where the run writes config, plan, metrics and checkpoints; empty means
    # runs/<model>-<cluster>/<time> (a sweep: <sweep dir>/<point>). Reuse a
    # directory to resume.
    run_dir: str = ""
    # The Slurm job's name, as typed (free text: spaces and any script; at
    # most 255 bytes, no control characters), and the readable part of the
    # run id (launcher/config/runid.py: <name>-<UTC time>-<random>, reduced to
    # [A-Za-z0-9._-]), which names checkpoint locations and metric labels.
    # Empty: <model>-<cluster>, and the Slurm job is named by the run id.
    job_name: str = ""
    # Reusing a run dir whose training config changed: refused unless "force".
    resume: str = choice("auto", ResumeMode)
    # Reruns after failures (a node failure, a requeue nobody asked for)
    # before giving up; requeues after preemption or at the time limit are
    # counted apart (<run_dir>/requeues.log) and never use these up.
    max_restarts: int = 3
    # Seconds before the time limit at which Slurm sends USR2; the final save
    # and the requeue must fit in it. 0: planned (launcher/plan/stopping.py):
    # 120 s, or the expected final save plus margin when that is longer.
    signal_lead_s: int = 0
    exclusive: bool = True  # sbatch --exclusive
    cpus_per_task: int = 0  # 0: cpus_per_node / tasks_per_node
    mem_gb: int = 0  # 0: the node's memory minus headroom
    master_port: int = 0  # 0: derived from the job id / a free port
    # Self-healing (launcher/selfheal/supervisor.py; Slurm runs of job.kind
    # pretrain/finetune). A rank whose heartbeat (train/observe/heartbeat.py) does not
    # advance for this long during training steps is hung: its stacks are
    # dumped into <run_dir>/stacks/, the step is ended and restarted.
    # 0: 20x the step time, at least 120 s: the MEASURED step time (median of
    # the last 20 per-step intervals of the heartbeats) once 3 were seen, the
    # plan's PREDICTED one before that (launcher/selfheal/hangwatch.py).
    hang_timeout_s: float = 0.0
    # The same limit during start-up, checkpoint restore and save; 0: 900 s.
    hang_startup_timeout_s: float = 0.0
    # Root shared by the runs under it: default run dirs and the bad-node
    # ledger <runs_root>/bad_nodes.jsonl; relative to the directory
    # `python -m launcher` runs in (a Slurm job's working directory too).
    runs_root: str = "runs"
    # A node with at least bad_node_faults faults in the ledger within the
    # last bad_node_window_h hours is excluded from new submissions.
    bad_node_faults: int = 2
    bad_node_window_h: float = 24.0  # see bad_node_faults
    # Stragglers (launcher/selfheal/straggler.py, docs/self-healing.md): every
    # straggler_probe_every_steps steps each rank times a fixed matmul loop
    # alone (no collective; train/observe/probe.py). A rank is slow on a
    # probe when its time is over straggler_threshold x the median of its
    # peers'; a straggler when slow on at least straggler_min_slow of its
    # last straggler_window probes (probes right after a save not counted).
    # "warn" (default): recorded and exported; "replace": its node swapped
    # for a spare at a checkpoint boundary (none left: warned only).
    straggler: str = choice("warn", StragglerPolicy)
    straggler_threshold: float = 1.3  # a probe time over the peers' median: > 1
    straggler_window: int = 5  # the newest probes the rule looks at
    straggler_min_slow: int = 4  # slow probes of straggler_window that flag a rank
    straggler_probe_every_steps: int = 10  # steps between a rank's solo probes
    # In-process recovery (train/inprocess/, docs/self-healing.md): a lost rank's peers keep
    # their processes, a replacement takes its place with its state from its partner's host
    # memory, all roll back to one step. Meshrun's trainer, data parallel; local or Slurm.
    in_process_recovery: bool = False
    # Steps between peer copies (this rank's model and optimizer shards, LR, data position,
    # RNG, swapped with its partner). 1: at most the step in flight is redone; a copy moves
    # the rank's shard once (12-16 B a parameter / the dp degree), point to point.
    peer_copy_every_steps: int = 1
    # The longest a collective may take under in-process recovery: one queued
    # before a fault's abort fails after this long (one in flight at once).
    in_process_collective_timeout_s: float = 30.0
    # Replacements (local: in all; Slurm: an attempt's); then a death ends it.
    max_replacements: int = 3
    # A warm spare under in-process recovery: a process that loaded torch and the trainer
    # waits to take a lost rank (local: one; Slurm: one per held spare node). false: cold.
    warm_spare: bool = True
    # Grow back (launcher/selfheal/growback.py, docs/self-healing.md): while a run
    # trains on fewer nodes than planned (a fault shrank it, no spare left),
    # each node it left out that Slurm still gives the job gets a burn-in
    # every burnin_interval_s (the preflight's node checks, then an
    # all-reduce over the node's tasks); after burnin_passes passes in a
    # row it is re-admitted: the ranks save, and the run restarts at its
    # planned layout. false: the run stays shrunk until it ends.
    grow_back: bool = True
    burnin_passes: int = 2  # at least 2: one pass proves little
    burnin_interval_s: float = 60.0  # from the shrunk start (then from each burn-in's end)
    # At a shrink with no left-out node to grow back (launcher/selfheal/shrinkchoice.py):
    # requeue for a full allocation instead when the forecast says that holds
    # fewer GPU-hours and finishes no later (Slurm's own start estimate, the
    # measured step and restart times); false: always train on shrunk.
    requeue_when_cheaper: bool = True
    # The team's budget for the runs under runs_root: `meshrun fleet` shows
    # spent / left / projected against it (its --budget-usd overrides; the
    # newest run's value counts). 0: none.
    budget_usd: float = 0.0
    # The code a run uses (launcher/run/codesnap.py; docs/reproducibility.md):
    # "snapshot" packs the meshrun code this launcher runs from (git's files,
    # ignored ones left out) once per distinct content into
    # <runs_root>/.code/<user>/<digest>/ and the Slurm job, its requeues and restarts
    # run that copy; "clean" the same, refusing a tree with uncommitted
    # changes; "live" runs the checkout as it is when the job starts. Local
    # runs record the digest and git state and copy only a script job's
    # project (job.workdir: its program starts in <run dir>/workdir, as on Slurm).
    code: str = choice("snapshot", CodeMode)
    # The most a snapshot may pack (`meshrun snapshot --list` shows what it would).
    code_max_mb: float = 64.0
    # Paths (relative to job.workdir or the meshrun code dir) a snapshot packs
    # although they look like credentials (.env, *credentials*, keys: left
    # out by default and named in the dry run); each must exist.
    code_include: list[str] = field(default_factory=list)
    # Start only after these runs succeeded: run dirs or Slurm job ids, comma
    # separated (quote a list: launcher.after="'runs/a,12345'"); submitted
    # with --dependency=afterok and --kill-on-invalid-dep=yes
    # (launcher/slurm/depend.py). `meshrun pipeline FILE` sets it per stage.
    after: str = ""
    # Submit held (sbatch --hold): the job waits until `scontrol release <job>`.
    hold: bool = False


@dataclass
class RunConfig:
    """The whole composed run: what Hydra builds and ``train`` receives."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    qos: QosConfig = field(default_factory=QosConfig)
    data: DataConfig = field(default_factory=DataConfig)
    job: JobConfig = field(default_factory=JobConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)


# Config group name -> schema class, for registration and error messages.
GROUPS: dict[str, type] = {
    "cluster": ClusterConfig,
    "model": ModelConfig,
    "parallelism": ParallelismConfig,
    "storage": StorageConfig,
    "qos": QosConfig,
    "data": DataConfig,
    "job": JobConfig,
}
