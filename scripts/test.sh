#!/usr/bin/env bash
# The test command, on a fresh machine or an installed one:
#
#   bash scripts/test.sh [pytest args...]     e.g. bash scripts/test.sh -k walkthrough
#
# 1. Setup (idempotent): as root on Debian/Ubuntu `scripts/setup.sh
#    --test-cluster` (adds the local Slurm test cluster's packages), else the
#    plain `scripts/setup.sh`; then the venv (.venv or $MESHRUN_VENV) is used.
#    MESHRUN_TEST_SETUP=0 skips it and uses the python already on PATH.
# 2. The local Slurm test cluster (scripts/testcluster.sh): used as it is when
#    it already runs (never restarted, left running); started when it can be
#    (root, Slurm installed) and then stopped at exit; else not started.
# 3. One line says which tests cannot run here and why (they skip).
# 4. python -m pytest -q "$@" (pyproject.toml makes it print the 80 slowest);
#    with no arguments and the cluster up, the cluster tier in a second pytest
#    beside the unit and local tiers (MESHRUN_TEST_STREAMS=1: one pytest).
#
# MESHRUN_TEST_DRY=1 prints what it would do (one line per step) and runs
# nothing (tests/local/test_docs.py checks the decisions that way).
set -euo pipefail
cd "$(dirname "$0")/.."

DRY=${MESHRUN_TEST_DRY:-0}
say() { echo "meshrun test: $*"; }
step() { # command...: run it, or say it in dry mode
  if [ "$DRY" = 1 ]; then say "would run: $*"; else "$@"; fi
}
is_root_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }

# --- 1. setup ----------------------------------------------------------------
if [ "${MESHRUN_TEST_SETUP:-1}" = 0 ]; then
  say "setup skipped (MESHRUN_TEST_SETUP=0): using $(command -v python || echo 'no python')"
else
  if is_root_apt; then
    step bash scripts/setup.sh --test-cluster
  else
    step bash scripts/setup.sh
  fi
  venv=${MESHRUN_VENV:-.venv}
  if [ "$DRY" = 1 ]; then
    say "would use $venv/bin/activate"
  else
    # shellcheck disable=SC1091
    . "$venv/bin/activate"
  fi
fi

# --- 2. the local Slurm test cluster -------------------------------------------
cannot=()
status=$(scripts/testcluster.sh status 2>/dev/null || true)
use_cluster=1
if grep -q ': running' <<<"$status" && ! grep -q ': stopped' <<<"$status"; then
  say "test cluster already running: using it as it is (left running at exit)"
elif [ "$(id -u)" != 0 ]; then
  cannot+=("Slurm test cluster tests (its daemons run as root: sudo bash scripts/test.sh)")
  use_cluster=0
elif ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  cannot+=("Slurm test cluster tests (Slurm not installed: run as root on Debian/Ubuntu)")
  use_cluster=0
elif grep -q ': running' <<<"$status"; then
  # Partly up (someone else's cluster, a daemon died): fill in, never stop it.
  step scripts/testcluster.sh start
  say "test cluster was partly running: started the rest (left running at exit)"
else
  step scripts/testcluster.sh start
  if [ "$DRY" = 1 ]; then
    say "would stop the test cluster at exit (started here)"
  else
    stop_cluster=1
    trap 'scripts/testcluster.sh stop || true' EXIT
  fi
fi
if [ "$use_cluster" = 1 ]; then
  eval "$(scripts/testcluster.sh env)" # sbatch/squeue in the tests' subprocesses reach it
fi

# --- 3. what cannot run here, in one line --------------------------------------
[ -x /usr/bin/chromium ] || cannot+=("the fleet page's browser test (no /usr/bin/chromium: setup.sh --test-cluster installs it)")
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || cannot+=("GPU tests (no NVIDIA GPU)")
if [ "${#cannot[@]}" -gt 0 ]; then
  line=$(printf '%s; ' "${cannot[@]}")
  say "cannot run here, skipped: ${line%; }"
else
  say "every test can run here"
fi

# --- 4. the tests ----------------------------------------------------------------
# The whole suite with the cluster up runs as two streams side by side: the
# cluster tier waits on Slurm much of its time (this 2-core machine measured
# 47% idle during it, 37% during the local tier), so the unit and local tiers
# fill that time. Each stream is its own pytest; the cluster tier's output
# follows the other's. MESHRUN_TEST_STREAMS=1 runs one pytest over all.
if [ "$#" = 0 ] && [ "$use_cluster" = 1 ] && [ "${MESHRUN_TEST_STREAMS:-2}" != 1 ]; then
  if [ "$DRY" = 1 ]; then
    say "would run: python -m pytest -q tests/cluster, beside python -m pytest -q tests/unit tests/local"
    exit 0
  fi
  cluster_log=$(mktemp "${TMPDIR:-/tmp}/meshrun-test-cluster.XXXXXX")
  python -m pytest -q tests/cluster >"$cluster_log" 2>&1 &
  cluster_pid=$!
  # An interrupted run leaves no stream behind (the cluster stops after it).
  trap 'kill "$cluster_pid" 2>/dev/null || true; wait "$cluster_pid" 2>/dev/null || true; [ -z "${stop_cluster:-}" ] || scripts/testcluster.sh stop || true' EXIT
  say "the cluster tier runs beside this one; its output follows (log: $cluster_log)"
  rc_local=0
  python -m pytest -q tests/unit tests/local || rc_local=$?
  rc_cluster=0
  wait "$cluster_pid" || rc_cluster=$?
  echo
  say "the cluster tier (ran beside the unit and local tiers):"
  cat "$cluster_log"
  rm -f "$cluster_log"
  say "unit and local tiers: exit $rc_local; cluster tier: exit $rc_cluster"
  [ "$rc_local" = 0 ] && [ "$rc_cluster" = 0 ]
  exit $?
fi
if [ "$DRY" = 1 ]; then
  say "would run: python -m pytest -q${*:+ $*}"
  exit 0
fi
python -m pytest -q "$@"
