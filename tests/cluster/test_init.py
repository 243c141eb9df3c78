"""``meshrun init``: presets written from the real cluster.

On the shared local test cluster (read-only queries): the written presets
reproduce what scripts/testcluster.sh configured (4 nodes of 8 GPUs, 64 CPUs
and 256 GB; partitions research / training / inference with their QOS and
GPU shares), an existing preset is not overwritten without
--force, and the written presets compose and dry-run. The parsers on Slurm's
own output forms: tests/unit/test_init_parsers.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from testcluster_util import require_test_cluster

ROOT = Path(__file__).resolve().parents[2]


def init(conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ, MESHRUN_CONFIG_DIR=str(conf), PYTHONPATH=str(ROOT), SLURM_CONF=require_test_cluster()
    )
    cmd = [sys.executable, "-m", "launcher.cli", "init", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=conf.parent)


def configured_in_testcluster_sh(name: str) -> int:
    m = re.search(rf"\b{name}=(\d+)", (ROOT / "scripts" / "testcluster.sh").read_text())
    assert m, name
    return int(m.group(1))


@pytest.mark.slurm
def test_init_on_the_test_cluster_writes_presets_that_compose_and_dry_run(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    p = init(conf, "--name", "tcinit", "--dry-run")
    assert p.returncode == 0, p.stderr
    assert "is not one meshrun knows: set gpu_mem_gb=GB" in p.stdout and not conf.exists()

    # Without the GPUs' memory the preset cannot plan: the fix is said, not a command that fails.
    bare = tmp_path / "bare" / "conf"
    bare.parent.mkdir()  # init runs in the preset's parent folder, as a user would
    p = init(bare, "--name", "tcbare")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "meshrun init --name tcbare --force gpu_mem_gb=GB" in p.stdout and "use it:" not in p.stdout

    p = init(conf, "--name", "tcinit", "gpu_mem_gb=80")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "meshrun init: use it: python -m launcher cluster=tcinit qos=tcinit_research" in p.stdout
    cluster = yaml.safe_load((conf / "cluster" / "tcinit.yaml").read_text())
    nodes, gpus = configured_in_testcluster_sh("NODES"), configured_in_testcluster_sh("GPUS")
    assert (cluster["kind"], cluster["cluster_nodes"], cluster["gpus_per_node"]) == ("slurm", nodes, gpus)
    assert cluster["cpus_per_node"] == configured_in_testcluster_sh("CPUS")
    assert cluster["mem_per_node_gb"] == configured_in_testcluster_sh("MEM_MB") // 1024
    assert {q.name for q in conf.glob("qos/*.yaml")} == {
        f"tcinit_{t}.yaml" for t in ("research", "training", "inference")
    }
    for team in ("research", "training", "inference"):
        got = yaml.safe_load((conf / "qos" / f"tcinit_{team}.yaml").read_text())
        want = yaml.safe_load((ROOT / "conf" / "qos" / f"{team}.yaml").read_text())
        assert (got["partition"], got["qos"], got["account"]) == (team, team, team)
        assert got["time_limit_min"] == want["time_limit_min"] and got["grace_time_s"] == want["grace_time_s"]
        total = nodes * gpus  # the same GPUs as the QOS limit testcluster.sh rendered from conf/qos
        assert int(total * got["cluster_share_pct"] / 100) == int(total * want["cluster_share_pct"] / 100), (
            team
        )
        assert sorted(got["preempts"]) == sorted(want["preempts"]) or not want["preempts"], team

    before = (conf / "cluster" / "tcinit.yaml").read_text()
    p = init(conf, "--name", "tcinit", "gpu_mem_gb=40")
    assert p.returncode == 2 and "add --force to overwrite" in p.stderr, p.stderr
    assert (conf / "cluster" / "tcinit.yaml").read_text() == before
    assert init(conf, "--name", "tcinit", "--force", "gpu_mem_gb=80").returncode == 0

    env = dict(
        os.environ, MESHRUN_CONFIG_DIR=str(conf), PYTHONPATH=str(ROOT), SLURM_CONF=require_test_cluster()
    )
    cmd = [sys.executable, "-m", "launcher", "cluster=tcinit", "qos=tcinit_training", "launcher.dry_run=true"]
    d = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert d.returncode == 0, d.stdout + d.stderr
    assert "#SBATCH --partition=training" in d.stdout and "cluster=tcinit" in d.stdout
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
