"""Run one child process for a component: forward signals, mark ready, exit with its code.

Used by the inference, router and Mooncake runtimes, which wrap a real server binary
(vLLM's OpenAI server, vllm-router, mooncake_master) rather than re-implementing it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable

from slurmrl.runtime import component as rt

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def tcp_ok(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def run(
    comp: rt.Component,
    argv: list[str],
    env: dict[str, str],
    ready: Callable[[], bool] | None,
    what: str,
) -> int:
    """Start ``argv``; when ``ready()`` first returns true write the ready file; return the exit code."""
    print(f"slurmrl: {comp.name}.{comp.rank}: starting {what}: {' '.join(argv)}", flush=True)
    child = subprocess.Popen(argv, env=env)

    def forward(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)

    def watch_ready():
        while child.poll() is None:
            if ready is None or ready():
                rt.mark_ready(comp, f"{what} pid={child.pid}")
                print(f"slurmrl: {comp.name}.{comp.rank}: ready", flush=True)
                return
            time.sleep(1)

    threading.Thread(target=watch_ready, daemon=True).start()
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue
    print(f"slurmrl: {comp.name}.{comp.rank}: {what} exited with code {code}", flush=True)
    return code if code >= 0 else 128 - code


def child_env(comp: rt.Component, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in {**comp.instance.get("env", {}), **(extra or {})}.items():
        env[k] = rt.fill(v, comp)
    return env


def exit_with(code: int) -> None:
    sys.stdout.flush()
    sys.exit(code)
