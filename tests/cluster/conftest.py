"""Fixtures the cluster tier's SSH tests share (tests/ssh_server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ssh_server import SshServer, missing, ssh_server


@pytest.fixture(scope="module")
def login_node(tmp_path_factory: pytest.TempPathFactory, slurm_env: str) -> Iterator[SshServer]:
    """A real sshd on 127.0.0.1 whose sessions see the test cluster (SLURM_CONF): the login node."""
    why = missing()
    if why:
        pytest.skip(why)
    with ssh_server(tmp_path_factory.mktemp("sshd"), {"SLURM_CONF": slurm_env}) as server:
        yield server
