#!/usr/bin/env bash
# meshrun setup. Idempotent; changes nothing outside this checkout unless asked.
#
#   bash scripts/setup.sh                      user install: .venv in this checkout
#   bash scripts/setup.sh --test-cluster       also the local Slurm test cluster's
#                                              Debian packages (root; CI uses this)
#   bash scripts/setup.sh --torch-index URL    torch from that index into .venv
#                                              (e.g. https://download.pytorch.org/whl/cu126)
#   bash scripts/setup.sh --system-torch       keep the torch your python already has
#                                              (module load / conda): the venv sees it
#
# User install: a virtual environment (.venv, or $MESHRUN_VENV) made with
# python3 (or $PYTHON), so it works where only python3 exists and the system
# Python is externally managed (PEP 668); `pip install -e .` with the test
# and float8 (torchao) extras, NVML when an NVIDIA driver is present, and NVIDIA DALI where a wheel
# installs (else one line says so and the torch DataLoader is used). Without
# a torch it installs torch==2.13.0: PyTorch's CPU build on a Linux machine
# without an NVIDIA GPU when download.pytorch.org answers, else the pip
# index's default. Then: `. .venv/bin/activate` (or call .venv/bin/python).
#
# --test-cluster (root, apt): Slurm, munge, slurmdbd, MariaDB, Prometheus and
# chromium (the headless browser tests/cluster/test_fleet_web.py drives with Playwright),
# OpenSSH's server (tests/local/test_remote_ssh.py starts its own sshd on 127.0.0.1)
# from Debian, through scripts/apt_install.sh, which keeps package scripts from
# starting daemons and leaves no policy-rc.d behind. Never on a site's own
# cluster: it would shadow the site's Slurm and munge.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "meshrun setup: $*"; }
die() {
  echo "meshrun setup: error: $*" >&2
  exit 1
}

TEST_CLUSTER=0 TORCH_INDEX=${MESHRUN_TORCH_INDEX:-} SYSTEM_TORCH=${MESHRUN_KEEP_TORCH:-0}
while [ $# -gt 0 ]; do
  case $1 in
    --test-cluster) TEST_CLUSTER=1 ;;
    --torch-index)
      [ $# -ge 2 ] || die "--torch-index needs a URL"
      TORCH_INDEX=$2
      shift
      ;;
    --system-torch) SYSTEM_TORCH=1 ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *) die "unknown option $1 (valid: --test-cluster, --torch-index URL, --system-torch, --help)" ;;
  esac
  shift
done

is_root_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }

# --- test cluster: system packages, only when asked ---------------------------
if [ "$TEST_CLUSTER" = 1 ]; then
  is_root_apt || die "--test-cluster installs Debian packages: run it as root on Debian/Ubuntu"
  missing=()
  for pair in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge slurmdbd:slurmdbd \
    mariadbd:mariadb-server prometheus:prometheus chromium:chromium sshd:openssh-server; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing the test cluster's Debian packages: ${missing[*]}"
    bash scripts/apt_install.sh slurm-wlm "${missing[@]}"
  fi
fi

# --- user install: a virtual environment in the checkout ---------------------
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3 python; do
    if command -v "$cand" >/dev/null; then PY=$cand && break; fi
  done
fi
[ -n "$PY" ] || die "no python3 found: install Python 3.10 or newer (Debian: apt-get install python3 python3-venv)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  die "$PY is Python $("$PY" -c 'import platform; print(platform.python_version())'); meshrun needs 3.10 or newer"

VENV=${MESHRUN_VENV:-.venv}
VPY=$VENV/bin/python
if [ ! -x "$VPY" ]; then
  venv_args=()
  [ "$SYSTEM_TORCH" = 1 ] && venv_args+=(--system-site-packages)
  if ! "$PY" -m venv "${venv_args[@]}" "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    # Debian/Ubuntu ship venv's pip bootstrap in a separate package.
    if is_root_apt; then
      say "$PY cannot make a virtual environment; installing Debian's python3-venv"
      bash scripts/apt_install.sh python3-venv
      "$PY" -m venv "${venv_args[@]}" "$VENV"
    else
      die "$PY cannot make a virtual environment: install python3-venv (sudo apt-get install python3-venv) and rerun"
    fi
  fi
fi
pip_install() { "$VPY" -m pip install -q --disable-pip-version-check "$@"; }
HAS_GPU=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then HAS_GPU=1; fi
CPU_INDEX=https://download.pytorch.org/whl/cpu

if ! "$VPY" -c 'import torch' 2>/dev/null; then
  if [ -n "$TORCH_INDEX" ]; then
    say "installing torch from $TORCH_INDEX"
    pip_install "torch>=2.6,<2.14" --index-url "$TORCH_INDEX" # pyproject's tested range
  elif [ "$SYSTEM_TORCH" = 1 ]; then
    die "--system-torch: $PY has no torch to keep; load your site's PyTorch (module load / conda activate) or use --torch-index URL"
  elif [ "$HAS_GPU" = 0 ] && [ "$(uname -s)" = Linux ] && "$VPY" -c \
    "import urllib.request as u; u.urlopen('$CPU_INDEX/', timeout=5)" 2>/dev/null; then
    # No NVIDIA GPU: PyTorch's CPU build (~200 MB), not PyPI's CUDA one (~4 GB).
    say "installing torch==2.13.0 (CPU build: no NVIDIA GPU here)"
    pip_install torch==2.13.0 --extra-index-url "$CPU_INDEX"
  else
    say "installing torch==2.13.0"
    pip_install torch==2.13.0
  fi
fi

# float8: torchao for train.float8, whose tests run in CI on CPU (emulated).
extras=test,float8
if [ "$HAS_GPU" = 1 ]; then extras=$extras,gpu; fi
pip_install -e ".[$extras]"

# DALI: the default loader where a wheel exists (Linux x86_64/aarch64);
# elsewhere the torch DataLoader yields the same samples in the same order.
# Its wheel (~420 MB) is kept in a wheel cache, so a new venv (another
# checkout, a rebuilt .venv) does not download it again.
DALI_REQ='nvidia-dali-cuda120>=1.40' # = pyproject's dali extra (tests/local/test_setup_script.py checks)
WHEELS=${MESHRUN_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/meshrun/wheels}
dali_wheel() { find "$WHEELS" -maxdepth 1 -name 'nvidia_dali_cuda120-*.whl' 2>/dev/null | sort -V | tail -n1; }
dali="not installed"
if [ "$(uname -s)" != Linux ] || [[ ! "$(uname -m)" =~ ^(x86_64|aarch64)$ ]]; then
  say "DALI skipped: no wheel for $(uname -s) $(uname -m); data loading uses the torch DataLoader"
elif "$VPY" -c 'import nvidia.dali' 2>/dev/null; then
  dali=installed
else
  if [ -z "$(dali_wheel)" ]; then
    mkdir -p "$WHEELS"
    "$VPY" -m pip download -q --disable-pip-version-check --no-deps -d "$WHEELS" "$DALI_REQ" >/dev/null 2>&1 || true
  fi
  if err=$(if [ -n "$(dali_wheel)" ]; then pip_install "$(dali_wheel)"; else pip_install "$DALI_REQ"; fi 2>&1); then
    dali=installed
  else
    say "DALI skipped: pip could not install it ($(echo "$err" | grep -m1 -i error || echo "$err" | tail -n1)); data loading uses the torch DataLoader"
  fi
fi

say "done: $("$VPY" -c 'import torch; print("torch", torch.__version__)'), DALI $dali, in $VENV"
say "activate it with: . $VENV/bin/activate   (or call $VPY directly)"
