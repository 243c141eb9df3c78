#!/usr/bin/env bash
# apt_install.sh PACKAGE...: install Debian packages (root) without letting
# their maintainer scripts start daemons (the test cluster starts its own).
#
# The daemon block is a temporary /usr/sbin/policy-rc.d (exit 101) that a trap
# removes when this script ends, failed or not, so no package on the machine
# is left unable to start its service (an sshd upgrade included). One that
# was already there (the admin's own) is left exactly as it was.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 PACKAGE..." >&2; exit 2; }
POLICY=${MESHRUN_POLICY_RC_D:-/usr/sbin/policy-rc.d}
if [ ! -e "$POLICY" ]; then
  trap 'rm -f "$POLICY"' EXIT
  printf '#!/bin/sh\n# meshrun apt_install.sh: temporary, removed when it ends\nexit 101\n' >"$POLICY"
  chmod +x "$POLICY"
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
