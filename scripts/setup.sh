#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine for meshrun: system packages (Slurm,
# munge, MariaDB for the local test cluster; Prometheus for the metrics test)
# and the Python package with its test extras. Idempotent.
#
# CPU-only machines get the CPU build torch==2.13.0. On a GPU cluster, install
# your CUDA build of torch first (e.g. pip install torch --index-url
# https://download.pytorch.org/whl/cu126); MESHRUN_KEEP_TORCH=1 leaves it alone.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # Package scripts must not start daemons: the test cluster starts its own.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm slurmctld slurmd slurm-client munge slurmdbd mariadb-server prometheus >/dev/null
fi

if [ "${MESHRUN_KEEP_TORCH:-0}" != 1 ] && ! python -c 'import torch' 2>/dev/null; then
  python -m pip install -q torch==2.13.0
fi
python -m pip install -q -e '.[test,dali]'
echo "meshrun: setup done ($(python -c 'import torch; print("torch", torch.__version__)'))"
