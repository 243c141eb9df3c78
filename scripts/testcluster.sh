#!/usr/bin/env bash
# A real Slurm cluster on this machine, from Debian's packages:
#   munged, mariadb + slurmdbd (accounting, QOS enforcement), slurmctld and
#   4 slurmd (node1..node4, each 8 GPUs as GRES on placeholder device files,
#   64 CPUs, 256 GB, each its own loopback address 127.0.1.N, labelled
#   lo:nodeN for gloo to bind to), partitions, QOS and QOS preemption rendered from
#   conf/qos by `python -m launcher.qos_admin` (preemption sends SIGTERM,
#   Slurm's and most sites' default, so tests prove the path every site has;
#   MESHRUN_TESTCLUSTER_PREEMPT_SIGNAL=user renders send_user_signal instead),
#   and real Pyxis + Enroot when their sources are at ../shared (CI has them;
#   MESHRUN_SHARED_DIR overrides): installed into /usr/local (the Pyxis job
#   epilog runs `enroot` from /usr/local/bin:/usr/bin:/bin), container state
#   under $DIR/enroot, plugstack line with container_scope=job, and cached
#   test images in $DIR/images (meshrun-test.sqsh, debian-python.sqsh).
#
#   scripts/testcluster.sh start|stop|status|env
#   eval "$(scripts/testcluster.sh env)"   # then sbatch/squeue/sacct work
#
# Hermetic: everything (configs, state, logs, sockets, munge key, database)
# lives under $MESHRUN_TESTCLUSTER_DIR (default /tmp/meshrun-testcluster).
# Idempotent: start skips running daemons; stop cancels the jobs, stops the
# daemons by their pid files, then ends what jobs left behind (slurmstepd and
# tasks of this cluster, found by their SLURM_CONF) and cleans up containers. Ports: ctld 16817, dbd 16819, mariadb 16806, nodes
# 17001-17004 (MESHRUN_TESTCLUSTER_PORT_BASE shifts them all).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DIR=${MESHRUN_TESTCLUSTER_DIR:-/tmp/meshrun-testcluster}
BASE=${MESHRUN_TESTCLUSTER_PORT_BASE:-16800}
CTLD_PORT=$((BASE + 17)) DBD_PORT=$((BASE + 19)) DB_PORT=$((BASE + 6))
NODE_PORT0=$((BASE + 200)) # node1..4 on NODE_PORT0+1..+4
NODES=4 GPUS=8 CPUS=64 MEM_MB=262144
PREEMPT_SIGNAL=${MESHRUN_TESTCLUSTER_PREEMPT_SIGNAL:-term} # term (site default) | user
CLUSTER=meshrun
PYTHON=${PYTHON:-python3}
export SLURM_CONF=$DIR/etc/slurm.conf
MUNGE_SOCKET=$DIR/munge/munge.socket
PYXIS_PREFIX=/usr/local
TEST_IMAGE=$DIR/images/meshrun-test.sqsh
BASE_IMAGE=$DIR/images/debian-python.sqsh
TEST_IMAGE_VERSION=2 # bump when build_test_image changes: the cached image is rebuilt

log() { echo "testcluster: $*" >&2; }

# Daemons run in their own session with stdio off the caller's, so they
# outlive whoever ran `start` (a test's or helper's process group killed
# later took mariadbd, started as its child, down with it) and never hold
# its pipes open. detach: a daemon that forks itself (waits for that parent
# and returns its status); detach_fg: one that stays in the foreground.
detach() { # name command...
  local name=$1
  shift
  setsid --wait nohup "$@" </dev/null >>"$DIR/log/$name.out" 2>&1
}
detach_fg() { # name command...
  local name=$1
  shift
  setsid --fork nohup "$@" </dev/null >>"$DIR/log/$name.out" 2>&1
}

alive() { # pidfile -> 0 if the process runs (zombies count as stopped)
  local pid state
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  state=$(ps -o stat= -p "$pid" 2>/dev/null || true)
  [ -n "$state" ] && [[ $state != Z* ]]
}

wait_for() { # seconds description command...
  local n=$1 what=$2
  shift 2
  for _ in $(seq $((n * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  log "timed out waiting for $what"
  return 1
}

install_packages() {
  local missing=()
  for bin in slurmctld slurmd sbatch munged slurmdbd mariadbd; do
    command -v "$bin" >/dev/null || missing+=("$bin")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Slurm, munge, MariaDB (missing: ${missing[*]})"
  # Package scripts must not start daemons; apt_install.sh leaves no policy-rc.d behind.
  bash "$ROOT/scripts/apt_install.sh" slurm-wlm slurmctld slurmd slurm-client munge slurmdbd mariadb-server
}

# Every "node" is this host, but each gets its own loopback address (any
# 127.x.y.z is loopback on Linux): NodeAddr 127.0.1.<i>, added to lo with the
# label lo:node<i>, so that gloo can be bound to it by name
# (GLOO_SOCKET_IFNAME=lo:node<i>; tests/faultinject does it for the
# vanished-rank test: a TaskProlog cannot, Pyxis runs it inside the
# container). A rank's gloo then listens on its node's address, and a
# survivor's "closed by peer [addr]" names the node the lost rank ran on:
# the supervisor's peer rule (launcher/selfheal/attribution.py) is proven end to
# end. 1 when some address cannot be added (no iproute2, no right to): all
# nodes then share 127.0.0.1.
node_addrs() {
  local i
  command -v ip >/dev/null || return 1
  for i in $(seq 1 $NODES); do
    ip -o -4 addr show dev lo | grep -q " 127\.0\.1\.$i/32 .*lo:node$i" && continue
    ip addr add "127.0.1.$i/32" dev lo label "lo:node$i" 2>>"$DIR/log/node-addrs.log" || return 1
  done
}

write_configs() {
  mkdir -p "$DIR"/{etc,log,run,state,dev,munge,db}
  for i in $(seq 0 $((GPUS - 1))); do
    [ -e "$DIR/dev/nvidia$i" ] || mknod "$DIR/dev/nvidia$i" c 195 "$i"
  done
  local partitions version nodes i
  version=$(slurmctld -V | awk '{print $2}')
  if node_addrs; then
    nodes=""
    for i in $(seq 1 $NODES); do
      nodes+="NodeName=node$i NodeHostname=localhost NodeAddr=127.0.1.$i Port=$((NODE_PORT0 + i)) CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:$GPUS State=UNKNOWN"$'\n'
    done
  else
    log "no address of its own per node (ip addr add refused): all nodes on 127.0.0.1, peer errors name no node"
    nodes="NodeName=node[1-$NODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$((NODE_PORT0 + 1))-$((NODE_PORT0 + NODES))] CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:$GPUS State=UNKNOWN"
  fi
  partitions=$("$PYTHON" -m launcher.qos_admin slurm-conf --nodes "node[1-$NODES]" \
    --preempt-signal "$PREEMPT_SIGNAL" --slurm-version "$version")
  cat >"$DIR/etc/slurm.conf" <<EOF
# Generated by scripts/testcluster.sh; edits are overwritten on start.
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire=10 + short scheduler intervals: requeued jobs restart in ~12 s.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$DIR/state/ctld
SlurmdSpoolDir=$DIR/state/slurmd-%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=5
PriorityType=priority/multifactor
PriorityWeightQOS=10000
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageEnforce=associations,limits,qos
AccountingStorageTRES=gres/gpu
# job_env: accounting keeps each job's environment (sacct --env-vars), as many
# sites do; tests prove that no credential of the submitting shell is in it.
AccountingStoreFlags=job_env
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
EnforcePartLimits=ALL
JobRequeue=1
# Slurm's default: a cancelled job's tasks get SIGTERM, then SIGKILL 30 s later.
KillWait=30
MinJobAge=600
ReturnToService=2
MailProg=/bin/true
PlugStackConfig=$DIR/etc/plugstack.conf
$nodes
# QOS preemption (victims get GraceTime from their QOS to checkpoint) and team
# partitions (python -m launcher.qos_admin slurm-conf):
$partitions
EOF
  cat >"$DIR/etc/gres.conf" <<EOF
AutoDetect=off
NodeName=node[1-$NODES] Name=gpu File=$DIR/dev/nvidia[0-$((GPUS - 1))]
EOF
  rm -f "$DIR/etc/cgroup.conf" # no cgroups here: linuxproc + task/none
  cat >"$DIR/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=root
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$DIR/etc/slurmdbd.conf"
}

shared_dir() { # the read-only shared/ with Pyxis + Enroot sources, if any
  local d
  for d in "${MESHRUN_SHARED_DIR:-}" "$ROOT/../shared" "$ROOT/shared"; do
    if [ -n "$d" ] && [ -f "$d/tools/install-pyxis-enroot.sh" ] && compgen -G "$d/vendor/enroot-*.tar.*" >/dev/null &&
      compgen -G "$d/vendor/pyxis-*.tar.*" >/dev/null; then
      (cd "$d" && pwd)
      return 0
    fi
  done
  return 1
}

install_pyxis() {
  # Pyxis + Enroot from the vendored release sources (idempotent: a rerun
  # with the same sources takes ~2 s); all container state lives under
  # $DIR/enroot and $DIR/run/pyxis. Started from a checkout without
  # ../shared, a Pyxis installed earlier is used as it is; with neither the
  # cluster runs without containers and the container tests skip saying so.
  # An empty plugstack.conf keeps slurm.conf valid.
  local shared=""
  : >"$DIR/etc/plugstack.conf"
  mkdir -p "$DIR/enroot" "$DIR/run/pyxis"
  if shared=$(shared_dir); then
    if ! bash "$shared/tools/install-pyxis-enroot.sh" --prefix "$PYXIS_PREFIX" --state-root "$DIR/enroot" \
      --build-dir "$DIR/pyxis-build" --pyxis-args "container_scope=job runtime_path=$DIR/run/pyxis" \
      "$(compgen -G "$shared/vendor/enroot-*.tar.*" | head -n 1)" \
      "$(compgen -G "$shared/vendor/pyxis-*.tar.*" | head -n 1)" >"$DIR/log/install-pyxis.log" 2>&1; then
      tail -20 "$DIR/log/install-pyxis.log" >&2
      log "Pyxis/Enroot install failed (log: $DIR/log/install-pyxis.log)"
      return 1
    fi
  elif [ -f "$PYXIS_PREFIX/lib/slurm/spank_pyxis.so" ] && [ -x "$PYXIS_PREFIX/bin/enroot" ]; then
    log "no ../shared here: using the Pyxis/Enroot installed in $PYXIS_PREFIX"
  else
    log "no ../shared with Pyxis/Enroot sources: no containers on this cluster"
    return 0
  fi
  # container_scope=job: a named container lives for one job and the epilog
  # removes it; runtime_path keeps Pyxis' state under $DIR.
  echo "required $PYXIS_PREFIX/lib/slurm/spank_pyxis.so container_scope=job runtime_path=$DIR/run/pyxis" \
    >"$DIR/etc/plugstack.conf"
  [ -n "$shared" ] || return 0 # test images: built from ../shared's tools, cached in $DIR/images
  build_test_image "$shared"
  # A Debian + python3 base (~60 s once, then cached): what the image command
  # test builds a standalone image from (python -m launcher.image build).
  bash "$shared/tools/make-test-image.sh" "$BASE_IMAGE" >>"$DIR/log/test-image.log" 2>&1
}

build_test_image() {
  # Enroot's skeleton image (empty dirs, merged-/usr links) plus a marker and
  # /opt/meshrun-test/python, which exist only in the image: run with the
  # host's /usr and python prefix mounted, every step that starts through it
  # leaves a proof in its run dir that it ran inside the container.
  [ -s "$TEST_IMAGE" ] && [ "$(cat "$TEST_IMAGE.version" 2>/dev/null)" = "$TEST_IMAGE_VERSION" ] && return 0
  local tmp
  mkdir -p "$DIR/images"
  tmp=$(mktemp -d "$DIR/images/build.XXXXXX")
  bash "$1/tools/make-test-image.sh" --kind skeleton "$tmp/base.sqsh" >"$DIR/log/test-image.log" 2>&1
  unsquashfs -q -d "$tmp/root" "$tmp/base.sqsh" >/dev/null
  echo "meshrun-test-image $(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$tmp/root/etc/meshrun-test-image"
  mkdir -p "$tmp/root/opt/meshrun-test"
  cat >"$tmp/root/opt/meshrun-test/python" <<'EOF'
#!/bin/sh
# Only in the meshrun test image: record that this step ran in the container
# and saw its run dir, then run the interpreter the test names.
if [ -n "${MESHRUN_RUN_DIR:-}" ] && [ -d "$MESHRUN_RUN_DIR" ]; then
  mkdir -p "$MESHRUN_RUN_DIR/container-proof"
  echo "$(cat /etc/meshrun-test-image) $*" \
    >"$MESHRUN_RUN_DIR/container-proof/${SLURM_JOB_ID}.${SLURM_RESTART_COUNT:-0}.${SLURM_STEP_ID}.${SLURM_PROCID}"
fi
exec "${MESHRUN_TEST_PYTHON:?set MESHRUN_TEST_PYTHON (cluster.env) to the host interpreter}" "$@"
EOF
  chmod 755 "$tmp/root/opt/meshrun-test/python"
  mksquashfs "$tmp/root" "$tmp/test.sqsh" -comp lz4 -all-root -noappend -quiet >/dev/null
  mv "$tmp/test.sqsh" "$TEST_IMAGE"
  echo "$TEST_IMAGE_VERSION" >"$TEST_IMAGE.version"
  rm -rf "$tmp"
  log "test image $TEST_IMAGE"
}

start_munge() {
  alive "$DIR/munge/munged.pid" && return 0
  chown munge:munge "$DIR/munge"
  chmod 700 "$DIR/munge"
  if [ ! -s "$DIR/munge/munge.key" ]; then
    mungekey --create --keyfile="$DIR/munge/munge.key"
    chown munge:munge "$DIR/munge/munge.key"
    chmod 400 "$DIR/munge/munge.key"
  fi
  detach munged runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
    --log-file="$DIR/munge/munged.log" --pid-file="$DIR/munge/munged.pid" --seed-file="$DIR/munge/seed" --force
  wait_for 10 munged test -S "$MUNGE_SOCKET"
}

start_mariadb() {
  alive "$DIR/run/mariadb.pid" && return 0
  if [ ! -d "$DIR/db/mysql" ]; then
    mariadb-install-db --no-defaults --user=root --datadir="$DIR/db" --auth-root-authentication-method=normal \
      >"$DIR/log/mariadb-install.log" 2>&1
  fi
  # Local, throwaway accounting database: bound to 127.0.0.1, no grant checks.
  detach_fg mariadb mariadbd --no-defaults --user=root --datadir="$DIR/db" --port="$DB_PORT" --bind-address=127.0.0.1 \
    --socket="$DIR/run/mariadb.sock" --pid-file="$DIR/run/mariadb.pid" --log-error="$DIR/log/mariadb.log" \
    --skip-grant-tables --innodb-buffer-pool-size=32M --innodb-log-file-size=8M
  wait_for 30 mariadb mariadb --no-defaults --socket="$DIR/run/mariadb.sock" -e 'select 1'
}

start_slurmdbd() {
  alive "$DIR/run/slurmdbd.pid" && return 0
  detach slurmdbd slurmdbd # reads slurmdbd.conf next to $SLURM_CONF
  wait_for 30 slurmdbd sacctmgr -n show cluster
}

start_slurmctld() {
  alive "$DIR/run/slurmctld.pid" && return 0
  mkdir -p "$DIR/state/ctld"
  detach slurmctld slurmctld -f "$SLURM_CONF"
  wait_for 30 slurmctld scontrol ping
}

start_slurmd() {
  for i in $(seq 1 $NODES); do
    alive "$DIR/run/slurmd-node$i.pid" && continue
    mkdir -p "$DIR/state/slurmd-node$i"
    detach "slurmd-node$i" slurmd -f "$SLURM_CONF" -N "node$i"
  done
  nodes_idle() { [ "$(sinfo -h -N -o '%N %t' | awk '$2 ~ /^(idle|mix|alloc)/' | sort -u | wc -l)" -ge $NODES ]; }
  if ! wait_for 30 "nodes" nodes_idle; then
    # A node left down/drained by an earlier run: resume it.
    scontrol update NodeName="node[1-$NODES]" State=RESUME 2>/dev/null || true
    wait_for 20 "nodes" nodes_idle
  fi
}

setup_accounting() {
  # Cluster registration, then QOS with GPU limits once slurmctld has
  # registered the gres/gpu TRES.
  sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
  wait_for 30 "gres/gpu TRES" bash -c "sacctmgr -n -P show tres format=type,name | grep -qx 'gres|gpu'"
  local user total=$((NODES * GPUS))
  user=$(id -un)
  while IFS= read -r cmd; do
    # `add` of an existing entity fails harmlessly; every `modify` must work.
    if [[ $cmd == *" add "* ]]; then
      eval "$cmd" >/dev/null 2>&1 || true
    else
      eval "$cmd" >/dev/null
    fi
  done < <("$PYTHON" -m launcher.qos_admin sacctmgr --total-gpus "$total" --user "$user")
  sacctmgr -i modify user "$user" set DefaultAccount=research >/dev/null 2>&1 || true
}

cmd_start() {
  local t0=$SECONDS
  install_packages
  write_configs
  install_pyxis
  start_munge
  start_mariadb
  start_slurmdbd
  start_slurmctld
  setup_accounting
  # slurmctld reads QOS/associations from slurmdbd; nodes after the QOS exist.
  start_slurmd
  scontrol reconfigure >/dev/null 2>&1 || true
  log "up in $((SECONDS - t0)) s: SLURM_CONF=$SLURM_CONF"
  sinfo >&2
}

stop_pidfile() { # pidfile name
  alive "$1" || return 0
  local pid
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do alive "$1" || return 0; sleep 0.2; done
  log "$2 ($pid) did not stop on TERM; killing"
  kill -9 "$pid" 2>/dev/null || true
}

cluster_pids() { # slurmstepd and job tasks of this cluster (by SLURM_CONF), not us
  local pid env p=$$ skip=" $$ $BASHPID "
  while [ "${p:-1}" -gt 1 ]; do # our ancestors (a job may run `stop`)
    skip+="$p "
    p=$(ps -o ppid= -p "$p" 2>/dev/null | tr -d ' ')
  done
  for pid in $(ps -eo pid=); do
    [[ $skip == *" $pid "* ]] && continue
    env=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ") || continue
    grep -qx "SLURM_CONF=$SLURM_CONF" <<<"$env" || continue
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmstepd ] || grep -q '^SLURM_JOB_ID=' <<<"$env"; then
      echo "$pid"
    fi
  done
}

cleanup_containers() {
  # Mounts Enroot/Pyxis left under $DIR (squashfuse, or a killed step's).
  local m
  for m in $(awk -v d="$DIR/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  # Per-job container state: Pyxis' runtime dir and Enroot's pyxis_* containers.
  rm -rf "$DIR/run/pyxis/"* "$DIR"/enroot/enroot-user-*/data/pyxis_* "$DIR"/enroot/enroot-user-*/runtime/* 2>/dev/null || true
}

cmd_stop() {
  [ -d "$DIR" ] || return 0
  # Jobs first, so slurmd can clean up their steps (and the Pyxis epilog
  # remove their containers).
  if alive "$DIR/run/slurmctld.pid"; then
    scancel --full --quiet --state=PENDING 2>/dev/null || true
    scancel --full --quiet 2>/dev/null || true
    wait_for 30 "jobs to end" bash -c '[ -z "$(squeue -h -o %i 2>/dev/null)" ]' || true
  fi
  for i in $(seq 1 $NODES); do stop_pidfile "$DIR/run/slurmd-node$i.pid" "slurmd node$i"; done
  stop_pidfile "$DIR/run/slurmctld.pid" slurmctld
  stop_pidfile "$DIR/run/slurmdbd.pid" slurmdbd
  stop_pidfile "$DIR/run/mariadb.pid" mariadb
  stop_pidfile "$DIR/munge/munged.pid" munged
  # What the daemons left behind: steps whose slurmd is gone, and their tasks.
  local left
  left=$(cluster_pids)
  if [ -n "$left" ]; then
    log "ending leftover job processes: $(echo $left)"
    kill $left 2>/dev/null || true
    sleep 2
    left=$(cluster_pids)
    if [ -n "$left" ]; then kill -9 $left 2>/dev/null || true; fi
  fi
  cleanup_containers
  log "stopped"
}

cmd_status() {
  local rc=0
  if alive "$DIR/munge/munged.pid"; then echo "munged: running"; else echo "munged: stopped"; rc=1; fi
  for name in mariadb slurmdbd slurmctld slurmd-node1 slurmd-node2 slurmd-node3 slurmd-node4; do
    if alive "$DIR/run/$name.pid"; then
      echo "$name: running (pid $(cat "$DIR/run/$name.pid"))"
    else
      echo "$name: stopped"
      rc=1
    fi
  done
  [ $rc = 0 ] && sinfo
  return $rc
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
env) echo "export SLURM_CONF=$SLURM_CONF" ;;
*)
  echo "usage: $0 start|stop|status|env" >&2
  exit 2
  ;;
esac
