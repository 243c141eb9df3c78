"""``meshrun run`` / ``python -m launcher [group=option ...] [key=value ...]``

Compose (Hydra) -> plan and validate -> then one of:
- ``launcher.dry_run=true``: print the plan and the exact sbatch script; exit 0;
- ``cluster=local`` (the default): run the job on this machine;
- a Slurm cluster: submit with submitit and return at once.

Hydra's ``--help``, ``--cfg job``, ``--info`` and ``-m`` work as usual. A
sweep's dry run (``-m ... launcher.dry_run=true``) prints one table, a row per
point (launcher/views/sweepdry.py); ``-v`` (``launcher.verbose=true``) prints
every point's full plan and sbatch script instead.
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from launcher.config.compose import CONF_DIR, composition_message
from launcher.config.configstore import register
from launcher.config.overrides import grammar_error, redact, unknown_in_argv
from launcher.entry.launch import error, run_task

register()


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def hydra_main(cfg: DictConfig) -> int:
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        # A sweep point (hydra_plugins/meshrun_launcher): its code goes back to
        # the sweep, which reports every point and exits once at the end.
        return run_task(cfg, hc.runtime.output_dir)
    code = run_task(cfg)
    if code:
        sys.exit(code)
    return 0


def cli() -> None:
    """Hydra's own errors (grammar, composition) as one ``meshrun: error:``
    line with exit code 2, instead of Hydra's report."""
    sys.argv[1:] = verbose_flag(sys.argv[1:])
    refuse_credentials(sys.argv[1:])
    msg = grammar_error(sys.argv[1:])
    if msg:
        error(msg)
        sys.exit(2)
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        hydra_main()  # the user asked for Hydra's full stack traces
        return
    from hydra.errors import HydraException

    # Hydra re-raises instead of printing its report, so the error is caught
    # here; local ranks inherit the variable but never run Hydra.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra_main()
    except (HydraException, OmegaConfBaseException) as e:
        # A typo gets the nearest valid name; anything else Hydra's message.
        msg = unknown_in_argv(sys.argv[1:]) or composition_message(e)
        error(redact(msg, sys.argv[1:]))
        sys.exit(2)


VERBOSE_FLAGS = ("-v", "--verbose")


def verbose_flag(argv: list[str]) -> list[str]:
    """``-v``/``--verbose`` as the override ``launcher.verbose=true``: Hydra's
    own parser knows no such flag, and an override reaches every sweep point."""
    if not any(a in VERBOSE_FLAGS for a in argv):
        return argv
    return [a for a in argv if a not in VERBOSE_FLAGS] + ["launcher.verbose=true"]


def refuse_credentials(argv: list[str]) -> None:
    """Credentials typed on the command line are refused before Hydra runs:
    it would repeat them in its errors and copy them into its output dir."""
    from launcher.config.secrets import override_findings, refusal

    found = override_findings(argv)
    if found:
        error(refusal(found[0]))
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    """``meshrun run ARGS``: the Hydra app with these overrides; its exit code."""
    saved = sys.argv
    if argv is not None:
        sys.argv = [f"{saved[0] if saved else 'meshrun'}", *argv]
    try:
        cli()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return 0
