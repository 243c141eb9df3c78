#!/usr/bin/env bash
# fresh_debian_check.sh: README's quick-start command in a clean Debian 12
# root filesystem, as a new user would run them; reports each phase's time and
# the time to the first loss line. Not part of CI (minutes, network).
#
#   sudo scripts/fresh_debian_check.sh [--workdir DIR] [--keep] [--user]
#
# The rootfs is `debootstrap --variant=minbase --include=python3,...
# bookworm` (what a stock Debian 12 has: python3, no python, no pip, no
# python3-venv), started with plain chroot (private /proc, /sys, /dev). The
# checkout goes in as `git archive HEAD` (committed files only, as a clone).
# Packages come from the internet the machine has: Debian's mirror and PyPI
# (so torch is PyPI's default build). No pip config from this host goes in;
# only its CA bundle (for the network's TLS proxy, if any) and resolv.conf.
#
# --user  run the commands as an unprivileged user (uid 1000) after root
#         installed python3-venv, the one thing a non-root user must ask
#         for; default: as root, which lets setup.sh install it itself.
# --keep  keep the rootfs (DIR/rootfs) for a look; a re-run reuses the
#         debootstrap tarball in DIR either way.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=/tmp/meshrun-fresh-debian KEEP=0 AS_USER=0
while [ $# -gt 0 ]; do
  case $1 in
    --workdir) WORK=$2 && shift ;;
    --keep) KEEP=1 ;;
    --user) AS_USER=1 ;;
    *) echo "usage: $0 [--workdir DIR] [--keep] [--user]" >&2 && exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "fresh_debian_check: needs root (debootstrap, chroot)" >&2; exit 2; }
command -v debootstrap >/dev/null || bash scripts/apt_install.sh debootstrap

log() { echo "fresh_debian_check: $*"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

FS=$WORK/rootfs
mkdir -p "$WORK"
mounts=()
cleanup() {
  local m
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
  # Never delete through a mount that is still there (the host's /dev, /sys).
  if grep -q " $FS/" /proc/mounts; then
    echo "fresh_debian_check: mounts left under $FS; not deleting it" >&2
  elif [ "$KEEP" = 0 ]; then
    rm -rf --one-file-system "$FS"
  fi
}
trap cleanup EXIT

t0=$(now)
if grep -q " $FS/" /proc/mounts; then
  echo "fresh_debian_check: $FS still has mounts from an earlier run; unmount them first" >&2
  exit 1
fi
rm -rf --one-file-system "$FS"
if [ ! -s "$WORK/bookworm-minbase.tgz" ]; then
  log "debootstrap bookworm minbase + python3 (first run only)"
  debootstrap --variant=minbase --include=python3,ca-certificates,git \
    --make-tarball="$WORK/bookworm-minbase.tgz" bookworm "$WORK/tarball-tmp" http://deb.debian.org/debian \
    >"$WORK/debootstrap.log" 2>&1
  rm -rf "$WORK/tarball-tmp"
fi
if [ -s "$WORK/rootfs-clean.tar" ]; then
  # The same clean rootfs as debootstrap made it on the first run (a tar copy:
  # seconds instead of minutes of dpkg).
  mkdir -p "$FS" && tar -xf "$WORK/rootfs-clean.tar" -C "$FS"
else
  debootstrap --variant=minbase --include=python3,ca-certificates,git \
    --unpack-tarball="$WORK/bookworm-minbase.tgz" bookworm "$FS" http://deb.debian.org/debian \
    >>"$WORK/debootstrap.log" 2>&1
  tar -cf "$WORK/rootfs-clean.tar" -C "$FS" .
fi
t_os=$(now)
log "clean Debian 12 rootfs in $(secs "$t0" "$t_os") s: $(chroot "$FS" python3 --version), \
python: $(chroot "$FS" sh -c 'command -v python || echo none'), \
venv: $(chroot "$FS" python3 -c 'import ensurepip' 2>/dev/null && echo yes || echo 'no (python3-venv missing)'), \
PEP 668: $(ls "$FS"/usr/lib/python3*/EXTERNALLY-MANAGED >/dev/null 2>&1 && echo externally managed || echo no)"

for m in proc sys dev; do
  mkdir -p "$FS/$m"
  mount --rbind "/$m" "$FS/$m" # dev: /dev/shm and /dev/pts too (torch's ranks use shm)
  mount --make-rslave "$FS/$m"
  mounts+=("$FS/$m")
done
cp /etc/resolv.conf "$FS/etc/resolv.conf"
# This machine reaches PyPI through a TLS-intercepting proxy: its CA bundle
# (a superset of Debian's) is the one host file the rootfs gets, as any
# machine on that network would have it.
cp /etc/ssl/certs/ca-certificates.crt "$FS/etc/ssl/certs/ca-certificates.crt"
home=/root
if [ "$AS_USER" = 1 ]; then
  chroot "$FS" useradd -m -u 1000 -s /bin/bash dev
  chroot "$FS" sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv >/dev/null'
  home=/home/dev
fi
mkdir -p "$FS$home/meshrun"
git -C "$ROOT" archive HEAD | tar -x -C "$FS$home/meshrun"
[ "$AS_USER" = 1 ] && chroot "$FS" chown -R dev:dev "$home"

# README's two commands, verbatim from its quick start.
cmds=$(awk '/^## Quick start/{q=1} q && /^```bash/{b=1; next} b && /^```/{exit} b' README.md)
log "README's commands: $(echo "$cmds" | paste -sd ';' -)"
run_as=(env -i HOME="$home" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 TERM=dumb)
[ "$AS_USER" = 1 ] && run_as=(setpriv --reuid=1000 --regid=1000 --init-groups "${run_as[@]}")
rm -f "$WORK/run.log" "$WORK/first_loss" "$WORK/first_loss_line"
t_start=$(now)
first_loss=""
set +e
chroot "$FS" "${run_as[@]}" bash -c "cd $home/meshrun && set -e && $(echo "$cmds" | paste -sd ';' -)" 2>&1 |
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$WORK/run.log"
    case $line in
      *"| loss "*)
        if [ ! -e "$WORK/first_loss" ]; then
          now >"$WORK/first_loss"
          echo "$line" >"$WORK/first_loss_line"
        fi
        ;;
    esac
    case $line in *setup:* | meshrun:* | *"| loss "* | *rror*) printf '  | %s\n' "$line" ;; esac
  done
rc=${PIPESTATUS[0]}
set -e
t_end=$(now)
if [ -e "$WORK/first_loss" ]; then first_loss=$(cat "$WORK/first_loss"); fi
rm -f "$WORK/first_loss"
log "exit code $rc; full output: $WORK/run.log"
log "setup + run: $(secs "$t_start" "$t_end") s; os image: $(secs "$t0" "$t_os") s"
if [ -n "$first_loss" ]; then
  log "time to first loss line: $(secs "$t_start" "$first_loss") s after typing the commands ($(cat "$WORK/first_loss_line"))"
else
  log "no loss line: the commands failed"
fi
[ -e "$FS/usr/sbin/policy-rc.d" ] && log "WARNING: policy-rc.d left in the rootfs"
exit "$rc"
