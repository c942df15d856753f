"""A real vLLM server on loopback for the orchestrator tests: start, wait for /health, stop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from slurmrl.plan.engines.vllm.flags import ENTRY


def serve(model: Path, port: int, log: Path) -> subprocess.Popen:
    """One real vLLM server on loopback, the way the job script's inference task runs it."""
    # the OpenAI server module, as the planner writes it for a one-node server
    argv = [sys.executable, *ENTRY, "--model", str(model),
            "--served-model-name", str(model),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "256",
            "--enforce-eager"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}
    return subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen | None) -> None:
    """SIGTERM (vLLM ends its engine), then SIGKILL to whatever of its tree is left after 60 s."""
    if proc is not None and proc.poll() is None:
        tree = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        kill(tree)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL to the server and its engine processes at once: vLLM's EngineCore and Worker outlive a SIGKILL
    of their API server alone (seen here with both vLLM entry points), and would hold their memory and CPU
    for the rest of the suite."""
    tree = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.wait(60)
    kill(tree)


def kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(procs, timeout=60)


def wait_health(url: str, proc: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-4000:]
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} not healthy after {timeout}s:\n{log.read_text()[-4000:]}")
