"""Mooncake from the mooncake-transfer-engine package, through slurmrl's runtime, on loopback.

mooncake_master runs here for real. mooncake_client links the CUDA driver (libcuda.so.1); on a
machine without one the test checks that the component fails at once and says why.
"""

from __future__ import annotations

import ctypes.util
import time
import urllib.error
import urllib.request

import pytest
from live_components import LiveComponent, free_port_base

from slurmrl.runtime.steps.supervise import tcp_ok

pytestmark = pytest.mark.vllm  # needs the runtime extras (mooncake-transfer-engine)

RECIPE = """
name = "mc"
kind = "inference"
[slurm]
gpus_per_node = 1
cpus_per_node = 8
[model]
path = "unused"
[inference.kv_offload]
kind = "mooncake"
cpu_gb = 1
mooncake_protocol = "tcp"
"""


@pytest.fixture
def run(tmp_path):
    from slurmrl.app.build import render

    recipe = tmp_path / "mc.toml"
    recipe.write_text(RECIPE)
    return render(recipe, run_dir=tmp_path / "run"), free_port_base()


def _tcp(port: int) -> bool:
    return tcp_ok("127.0.0.1", port, timeout=1)


def test_master_serves_rpc_and_metadata_and_stops_on_term(run):
    out, base = run
    master = LiveComponent(out.run_dir, "mooncake-master", base)
    try:
        deadline = time.monotonic() + 60
        while not _tcp(base + 2) and time.monotonic() < deadline:
            assert master.proc.poll() is None, master.tail()
            time.sleep(0.5)
        assert _tcp(base + 2), master.tail()
        try:  # the HTTP metadata server answers (an unknown key is a 4xx, not a refused connection)
            urllib.request.urlopen(f"http://127.0.0.1:{base + 3}/metadata?key=none", timeout=5)
        except urllib.error.HTTPError as e:
            assert 400 <= e.code < 500
        for _ in range(20):
            if (out.run_dir / "ready" / "attempt-0" / "mooncake-master.0").exists():
                break
            time.sleep(0.5)
        assert (out.run_dir / "ready" / "attempt-0" / "mooncake-master.0").exists()
    finally:
        code = master.stop(timeout=30)
    assert code == 0, master.tail()


def test_client_needs_a_gpu_driver_and_says_so(run):
    out, base = run
    client = LiveComponent(out.run_dir, "mooncake-client", base)
    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has a CUDA driver; the real client path is covered on GPU nodes")
    assert client.proc.wait(timeout=60) != 0
    assert "libcuda.so.1" in client.tail()
    client.stop()
