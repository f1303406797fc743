"""``roundgate serve`` without ``--address`` starts its own cluster, even where a dead one left
its address behind (Ray's ``ray_current_cluster`` file, which a bare ``ray.init()`` would
try to join, failing with "When connecting to an existing cluster, num_cpus ... must not be
provided"). A crashed test session left exactly that file once, and every later session's
cluster failed to start."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROBE = """
from roundgate.deployment.local import start_local_cluster
start_local_cluster(num_cpus=1)
import ray
print("cpus", ray.cluster_resources()["CPU"])
ray.shutdown()
"""


def test_a_stale_cluster_address_does_not_stop_a_new_local_cluster() -> None:
    # A short directory of its own: Ray's socket paths live under it (a Unix socket path is
    # at most 107 bytes), and the stale file must not touch the session's cluster.
    tmp = tempfile.mkdtemp(prefix="rg-", dir="/tmp")
    try:
        (Path(tmp) / "ray").mkdir()
        (Path(tmp) / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")  # nobody there
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": tmp}
        done = subprocess.run(
            [sys.executable, "-c", PROBE],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "cpus 1.0" in done.stdout, done.stdout
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
