#!/bin/bash

# Parameters
#SBATCH --account=research
#SBATCH --comment='meshrun run_dir=/shared/runs/golden/1node'
#SBATCH --cpus-per-task=24
#SBATCH --error=/shared/runs/golden/1node/slurm/%j_0_log.err
#SBATCH --exclusive
#SBATCH --gpus-per-node=8
#SBATCH --job-name=meshrun
#SBATCH --mem=1945GB
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --open-mode=append
#SBATCH --output=/shared/runs/golden/1node/slurm/%j_0_log.out
#SBATCH --partition=research
#SBATCH --qos=research
#SBATCH --requeue
#SBATCH --signal=USR2@120
#SBATCH --time=1440
#SBATCH --wckey=meshrun

# setup
export NCCL_DEBUG=WARN
export NCCL_IB_DISABLE=1
export NCCL_NVLS_ENABLE=1
export NCCL_P2P_LEVEL=NVL
export NCCL_SOCKET_IFNAME=lo
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export PYTHONPATH=/workspace/meshrun${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export MESHRUN_RUN_DIR=/shared/runs/golden/1node
MESHRUN_HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol -o show node "$MESHRUN_HEAD" | sed -n "s/.*NodeAddr=\([^ ]*\).*/\1/p")
export MASTER_ADDR="${MASTER_ADDR:-$MESHRUN_HEAD}"
export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))
echo "meshrun: job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST rendezvous $MASTER_ADDR:$MASTER_PORT"
srun '--container-image=nvcr.io#nvidia/pytorch:25.03-py3' --container-name=meshrun_11a21b297f9a --container-mounts=/opt/meshrun:/workspace/meshrun,/shared/runs/golden/1node:/shared/runs/golden/1node,/scratch:/scratch --container-workdir=/workspace/meshrun --no-container-mount-home --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 python3 -u -m launcher.preflight --node "$MESHRUN_RUN_DIR" || { echo "meshrun: preflight failed: training not started (see above)" >&2; exit 1; }
srun '--container-image=nvcr.io#nvidia/pytorch:25.03-py3' --container-name=meshrun_11a21b297f9a --container-mounts=/opt/meshrun:/workspace/meshrun,/shared/runs/golden/1node:/shared/runs/golden/1node,/scratch:/scratch --container-workdir=/workspace/meshrun --no-container-mount-home python3 -u -m train.preflight_comm "$MESHRUN_RUN_DIR" || { echo "meshrun: preflight failed: training not started (see above)" >&2; exit 1; }

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /shared/runs/golden/1node/slurm/%j_%t_log.out --error /shared/runs/golden/1node/slurm/%j_%t_log.err '--container-image=nvcr.io#nvidia/pytorch:25.03-py3' --container-name=meshrun_11a21b297f9a --container-mounts=/opt/meshrun:/workspace/meshrun,/shared/runs/golden/1node:/shared/runs/golden/1node,/scratch:/scratch --container-workdir=/workspace/meshrun --no-container-mount-home python3 -u -m train.signals /shared/runs/golden/1node


# teardown
MESHRUN_RC=$?
if [ "$MESHRUN_RC" -eq 75 ]; then
  if [ "${SLURM_RESTART_COUNT:-0}" -lt 3 ]; then
    echo "meshrun: checkpointed after a signal; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID" && exit 0
  else
    echo "meshrun: giving up after 3 restarts (launcher.max_restarts)" >&2
  fi
fi
exit "$MESHRUN_RC"