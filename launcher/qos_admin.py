"""``python -m launcher.qos_admin``: the documented alias of ``meshrun qos-admin`` (launcher/commands/qos_admin.py)."""

import sys

from launcher.commands.qos_admin import main

if __name__ == "__main__":
    sys.exit(main())
