#!/bin/bash

# Parameters
#SBATCH --account=research
#SBATCH --comment='meshrun run_dir=/shared/runs/golden/4node'
#SBATCH --cpus-per-task=24
#SBATCH --error=/shared/runs/golden/4node/slurm/%j_0_log.err
#SBATCH --exclusive
#SBATCH --gpus-per-node=8
#SBATCH --job-name=meshrun
#SBATCH --mem=1945GB
#SBATCH --no-kill
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=8
#SBATCH --open-mode=append
#SBATCH --output=/shared/runs/golden/4node/slurm/%j_0_log.out
#SBATCH --partition=research
#SBATCH --qos=research
#SBATCH --requeue
#SBATCH --signal=USR2@120
#SBATCH --time=1440
#SBATCH --wckey=meshrun

# setup
export NCCL_DEBUG=WARN
export NCCL_IB_DISABLE=0
export NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
export NCCL_IB_TIMEOUT=22
export NCCL_NET_GDR_LEVEL=PXB
export NCCL_SOCKET_IFNAME='^lo,docker,ib'
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export PYTHONPATH=/workspace/meshrun${PYTHONPATH:+:$PYTHONPATH}
export PYTHONSAFEPATH=1
export PYTHONUNBUFFERED=1
export MESHRUN_RUN_DIR=/shared/runs/golden/4node
MESHRUN_HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol -o show node "$MESHRUN_HEAD" | sed -n "s/.*NodeAddr=\([^ ]*\).*/\1/p")
export MASTER_ADDR="${MASTER_ADDR:-$MESHRUN_HEAD}"
export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))
trap 'MESHRUN_GOT_TERM=1' TERM
export MESHRUN_KILL_WAIT_S=$(scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\([0-9]*\).*/\1/p')
MESHRUN_PREEMPT_REQUEUES=$(grep -sc "^$SLURM_JOB_ID [0-9]* preemption " "$MESHRUN_RUN_DIR/requeues.log" || true)
MESHRUN_TIME_LIMIT_REQUEUES=$(grep -sc "^$SLURM_JOB_ID [0-9]* time_limit " "$MESHRUN_RUN_DIR/requeues.log" || true)
export MESHRUN_PREEMPT_REQUEUES=${MESHRUN_PREEMPT_REQUEUES:-0} MESHRUN_TIME_LIMIT_REQUEUES=${MESHRUN_TIME_LIMIT_REQUEUES:-0}
export MESHRUN_FAILURE_RESTARTS=$(( ${SLURM_RESTART_COUNT:-0} - MESHRUN_PREEMPT_REQUEUES - MESHRUN_TIME_LIMIT_REQUEUES ))
if [ "$MESHRUN_FAILURE_RESTARTS" -gt 3 ]; then
  echo "meshrun: giving up: job $SLURM_JOB_ID was restarted $MESHRUN_FAILURE_RESTARTS times after failures (launcher.max_restarts=3; preemption and time-limit requeues do not count)" >&2
  exit 1
fi
echo "meshrun: job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} (preemptions $MESHRUN_PREEMPT_REQUEUES, time limits $MESHRUN_TIME_LIMIT_REQUEUES, failures $MESHRUN_FAILURE_RESTARTS) on $SLURM_JOB_NODELIST rendezvous $MASTER_ADDR:$MASTER_PORT"
MESHRUN_PREFLIGHT_SRUN=
if ! srun --kill-on-bad-exit=0 '--container-image=nvcr.io#nvidia/pytorch:25.03-py3' --container-name=meshrun_11a21b297f9a:no_exec --container-mounts=/opt/meshrun:/workspace/meshrun,/shared/runs/golden/4node:/shared/runs/golden/4node,/scratch:/scratch --container-workdir=/workspace/meshrun --no-container-mount-home --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 python3 -u -m launcher.preflight --node "$MESHRUN_RUN_DIR"; then
  MESHRUN_PREFLIGHT_SRUN=$(PYTHONPATH=/opt/meshrun python3 -m launcher.preflight --record "$MESHRUN_RUN_DIR") || { echo "meshrun: preflight failed: training not started (see above)" >&2; exit 1; }
fi
srun --kill-on-bad-exit=1 '--container-image=nvcr.io#nvidia/pytorch:25.03-py3' --container-name=meshrun_11a21b297f9a:no_exec --container-mounts=/opt/meshrun:/workspace/meshrun,/shared/runs/golden/4node:/shared/runs/golden/4node,/scratch:/scratch --container-workdir=/workspace/meshrun --no-container-mount-home $MESHRUN_PREFLIGHT_SRUN python3 -u -m train.observe.preflight_comm "$MESHRUN_RUN_DIR" || { echo "meshrun: preflight failed: training not started (see above)" >&2; exit 1; }

# command
export SUBMITIT_EXECUTOR=slurm
if PYTHONPATH=/opt/meshrun python3 -c 'import launcher.selfheal' 2>/dev/null; then
  MESHRUN_TASK_PYTHONPATH="${PYTHONPATH:-}" PYTHONPATH=/opt/meshrun python3 -u -m launcher.selfheal "$MESHRUN_RUN_DIR" -- srun --unbuffered --open-mode=append --output /shared/runs/golden/4node/slurm/%j_%t_log.out --error /shared/runs/golden/4node/slurm/%j_%t_log.err --kill-on-bad-exit=1 '--container-image=nvcr.io#nvidia/pytorch:25.03-py3' --container-name=meshrun_11a21b297f9a:no_exec --container-mounts=/opt/meshrun:/workspace/meshrun,/shared/runs/golden/4node:/shared/runs/golden/4node,/scratch:/scratch --container-workdir=/workspace/meshrun --no-container-mount-home python3 -u -m train /shared/runs/golden/4node
else
  echo "meshrun: no supervisor on the batch host: one srun, no restart inside the allocation" >&2
  srun --unbuffered --open-mode=append --output /shared/runs/golden/4node/slurm/%j_%t_log.out --error /shared/runs/golden/4node/slurm/%j_%t_log.err --kill-on-bad-exit=1 '--container-image=nvcr.io#nvidia/pytorch:25.03-py3' --container-name=meshrun_11a21b297f9a:no_exec --container-mounts=/opt/meshrun:/workspace/meshrun,/shared/runs/golden/4node:/shared/runs/golden/4node,/scratch:/scratch --container-workdir=/workspace/meshrun --no-container-mount-home python3 -u -m train /shared/runs/golden/4node
fi


# teardown
MESHRUN_RC=$?
PYTHONPATH=/opt/meshrun python3 -m launcher.selfheal job-end "$MESHRUN_RUN_DIR" "$MESHRUN_RC"
if [ "$MESHRUN_RC" -eq 75 ] || [ "$MESHRUN_RC" -eq 76 ]; then
  if [ "$MESHRUN_RC" -eq 76 ]; then echo "meshrun: stopped after a signal, but the final checkpoint did NOT commit (see the log); the work since the newest committed step is lost and a requeued job resumes from that step" >&2; fi
  MESHRUN_JOB=$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null)
  MESHRUN_STATE=$(echo "$MESHRUN_JOB" | sed -n 's/.*JobState=\([^ ]*\).*/\1/p')
  MESHRUN_PREEMPTED=$(echo "$MESHRUN_JOB" | sed -n 's/.* PreemptTime=\([^ ]*\).*/\1/p')
  if [ "$MESHRUN_STATE" != RUNNING ]; then
    echo "meshrun: checkpointed after a signal; job $SLURM_JOB_ID is ${MESHRUN_STATE:-unknown to Slurm} (cancelled, or past its limit): not requeueing"
    exit "$MESHRUN_RC"
  fi
  if [ "${MESHRUN_PREEMPTED:-None}" != None ]; then MESHRUN_CAUSE=preemption; else MESHRUN_CAUSE=time_limit; fi
  echo "$SLURM_JOB_ID ${SLURM_RESTART_COUNT:-0} $MESHRUN_CAUSE $(date +%s)" >> "$MESHRUN_RUN_DIR/requeues.log"
  echo "meshrun: checkpointed after a signal ($MESHRUN_CAUSE: Slurm says JobState=$MESHRUN_STATE PreemptTime=${MESHRUN_PREEMPTED:-None}); requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID" && exit 0
  sed -i '$ d' "$MESHRUN_RUN_DIR/requeues.log"  # not requeued after all
  echo "meshrun: scontrol requeue $SLURM_JOB_ID failed; the checkpoint is kept" >&2
elif [ "$MESHRUN_RC" -ne 0 ]; then
  MESHRUN_FAILED=$(grep -s "^$SLURM_JOB_ID ${SLURM_RESTART_COUNT:-0} rank " "$MESHRUN_RUN_DIR/failures.log" | head -n 1 | cut -d" " -f3-)
  echo "meshrun: job $SLURM_JOB_ID failed (srun exit $MESHRUN_RC): ${MESHRUN_FAILED:-a task died without a Python error; see the srun lines above}" >&2
fi
exit "$MESHRUN_RC"