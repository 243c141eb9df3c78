"""Test-only fault injection for the self-healing tests (tests/cluster/test_selfheal.py).

Put this directory on PYTHONPATH (the batch script keeps the submitter's
PYTHONPATH after the code dir): Python imports ``sitecustomize`` at start-up.
In a Slurm task (``SLURM_PROCID`` set) with ``MESHRUN_TEST_RAISE_AT_STEP=N``,
the training loop raises ``RuntimeError`` when it starts step N (its
heartbeat, ``train.observe.heartbeat.beat("step", N)``), on every rank and every
attempt: a bug in the code, not a node. With
``MESHRUN_TEST_FULL_DISK_NODEID=K``, the preflight on the job's K-th node
(``SLURM_NODEID``) sees its disks full (``shutil.disk_usage`` in
``launcher.nodecheck.hostcheck`` reports 0 bytes free), so its real scratch check
fails there only: one bad node on a one-host test cluster. With
``MESHRUN_TEST_STEP_SLEEP_S=X``, every step's heartbeat in the job's first
allocation (``SLURM_RESTART_COUNT`` unset or 0) sleeps X seconds first: a
first allocation too slow to finish, later ones at full speed (the
time-limit test: one requeue, whatever the machine's load). With
``MESHRUN_TEST_FAIL_MANIFEST_RANK=R``, rank R's processes (``RANK``; its
checkpoint worker inherits it) cannot write a manifest
(``train.checkpoint.manifest.write_manifest`` raises ENOSPC): a directory
leader whose commit fails while the others' succeed. With
``MESHRUN_TEST_DUTY_CYCLE_RANK=R`` (and ``MESHRUN_TEST_DUTY_CYCLE_MS=STOP,RUN``,
default 15,5), task R (``SLURM_PROCID``) of the supervisor's first attempt
(``MESHRUN_ATTEMPT=0.0``: the slowness stays with the node it ran on) gets
a sidecar process that SIGSTOPs it for STOP ms and SIGCONTs it for RUN ms,
over and over: a rank really slowed (a throttled GPU, a starved CPU), every
thread of it; the sidecar ends with the task. With
``MESHRUN_TEST_VANISH_AT_STEP=N`` and ``MESHRUN_TEST_VANISH_RANK=R``, task R
(``SLURM_PROCID``) of the first attempt leaves at step N with ``os._exit(1)``:
no Python error recorded, no signal, its sockets closed (as a node whose
NIC or driver died looks to its peers): only the survivors' connection
errors name it. With ``MESHRUN_TEST_GLOO_PER_NODE=1``, a task's gloo is bound
to its node's own loopback address (``GLOO_SOCKET_IFNAME=lo:<node>``, the
label scripts/testcluster.sh gives each node's NodeAddr), as a real site's
interface setting puts it on the node's own NIC. Nothing else is touched.
"""

import importlib.abc
import importlib.util
import os
import sys

if os.environ.get("MESHRUN_TEST_GLOO_PER_NODE") == "1" and os.environ.get("SLURMD_NODENAME"):
    os.environ["GLOO_SOCKET_IFNAME"] = f"lo:{os.environ['SLURMD_NODENAME']}"

_STEP = os.environ.get("MESHRUN_TEST_RAISE_AT_STEP", "")
_FULL = os.environ.get("MESHRUN_TEST_FULL_DISK_NODEID", "")
_NO_MANIFEST = os.environ.get("MESHRUN_TEST_FAIL_MANIFEST_RANK", "")
_DUTY_RANK = os.environ.get("MESHRUN_TEST_DUTY_CYCLE_RANK", "")
_VANISH = (
    os.environ.get("MESHRUN_TEST_VANISH_AT_STEP", "")
    if os.environ.get("SLURM_PROCID") == os.environ.get("MESHRUN_TEST_VANISH_RANK", "-")
    and os.environ.get("MESHRUN_ATTEMPT") == "0.0"
    else ""
)
_DUTY = """
import os, signal, sys, time
pid, stop_s, run_s = int(sys.argv[1]), float(sys.argv[2]) / 1000, float(sys.argv[3]) / 1000
# srun passes the step's stop signals to every process of the task: dying of
# one here would leave the task stopped for good.
for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(sig, signal.SIG_IGN)
while True:
    try:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(stop_s)
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        break
    time.sleep(run_s)
"""
_SLEEP = (
    os.environ.get("MESHRUN_TEST_STEP_SLEEP_S", "")
    if os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
    else ""
)


class _FullDisk:
    """``shutil`` for hostcheck, with every disk full."""

    def __getattr__(self, name):
        import shutil

        return getattr(shutil, name)

    def disk_usage(self, path):
        import shutil

        total = shutil.disk_usage(path).total
        return shutil._ntuple_diskusage(total, total, 0)


class _OnImport(importlib.abc.MetaPathFinder):
    """Calls ``patch(module)`` right after module ``name`` is first executed."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        orig_exec = spec.loader.exec_module

        def exec_module(module):
            orig_exec(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _full_disks(module):
    module.shutil = _FullDisk()


def _patch_beat(module):
    import time

    real = module.beat

    def beat(phase, step=0):
        if phase == "step" and _STEP.isdigit() and step == int(_STEP):
            raise RuntimeError(f"injected bug at step {step}")
        if phase == "step" and _VANISH.isdigit() and step == int(_VANISH):
            os._exit(1)
        if phase == "step" and _SLEEP:
            time.sleep(float(_SLEEP))
        real(phase, step)

    module.beat = beat


def _no_manifest(module):
    import errno

    def write_manifest(path, manifest):
        raise OSError(errno.ENOSPC, "No space left on device (injected)", os.path.join(path, "manifest.json"))

    module.write_manifest = write_manifest


def _duty_cycle():
    import subprocess

    stop_ms, run_ms = (os.environ.get("MESHRUN_TEST_DUTY_CYCLE_MS") or "15,5").split(",")
    # -S -E: no site (this file) and no PYTHON* variables in the sidecar.
    subprocess.Popen([sys.executable, "-S", "-E", "-c", _DUTY, str(os.getpid()), stop_ms, run_ms])
    os.environ.pop("MESHRUN_TEST_DUTY_CYCLE_RANK")  # not again in its children (the checkpoint worker)


if (
    _DUTY_RANK.isdigit()
    and os.environ.get("SLURM_PROCID") == _DUTY_RANK
    and os.environ.get("MESHRUN_ATTEMPT") == "0.0"
):
    _duty_cycle()
if (_STEP.isdigit() or _SLEEP or _VANISH) and "SLURM_PROCID" in os.environ:
    sys.meta_path.insert(0, _OnImport("train.observe.heartbeat", _patch_beat))
if _FULL.isdigit() and os.environ.get("SLURM_NODEID") == _FULL and "SLURM_STEP_ID" in os.environ:
    sys.meta_path.insert(0, _OnImport("launcher.nodecheck.hostcheck", _full_disks))
if _NO_MANIFEST.isdigit() and os.environ.get("RANK") == _NO_MANIFEST:
    sys.meta_path.insert(0, _OnImport("train.checkpoint.manifest", _no_manifest))
