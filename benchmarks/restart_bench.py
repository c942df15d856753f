"""How long a server is gone when its engine dies and its supervisor restarts it in place
(``slurmrl.runtime.steps.restart``). Runs one real vLLM server (the tiny test model, or ``--model``) under
the supervisor on loopback, no Slurm, with ``--restart on-failure --restart-backoff BACKOFF``, SIGKILLs
its engine (EngineCore; the API server where there is none) ``--kills`` times and prints, per kill, the
seconds from the kill to: the ``died`` event, the relaunch (``restarted``), the ready file of the new
server, and its first completion. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/restart_bench.py               # tiny model on the CPU build, 1 kill
    .venv/bin/python benchmarks/restart_bench.py --model PATH --kills 3 --backoff 10
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from slurmrl.contract import events
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(predicate, timeout: float = 900.0, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise SystemExit("timed out")


def ready_pid(run: RunDir, not_pid: int | None) -> int | None:
    path = run.ready_file(0, "inference", 0)
    if not path.exists():
        return None
    _, _, pid = read_ready(path)
    return pid if pid and pid != not_pid else None


def engine(pid: int) -> psutil.Process:
    kids = [p for p in psutil.Process(pid).children(recursive=True) if "EngineCore" in p.name()]
    return kids[0] if kids else psutil.Process(pid)


def completion(url: str, model: str) -> bool:
    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 1}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status == 200
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a model folder (default: the tiny test model, built in a temporary folder)")
    ap.add_argument("--kills", type=int, default=1)
    ap.add_argument("--backoff", type=int, default=0, help="--restart-backoff (seconds before the first restart)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="restart-bench-"))
    if a.model is None:
        a.model = str(build_tiny(tmp / "tiny"))
    run, port = RunDir(tmp / "run"), free_port()
    run.path.mkdir()
    env = {**os.environ, "SLURMRL_RUN_DIR": str(run.path), "SLURMRL_ATTEMPT": "0", "SLURM_PROCID": "0",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    url = f"http://127.0.0.1:{port}"
    sup = subprocess.Popen(
        [sys.executable, "-m", "slurmrl.runtime.steps.supervise", "inference", "--ready", url,
         "--restart", "on-failure", "--max-restarts", str(a.kills), "--restart-backoff", str(a.backoff), "--",
         sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", a.model, "--host", "127.0.0.1",
         "--port", str(port), "--dtype", "float32", "--enforce-eager"],
        env=env, stdout=open(tmp / "supervise.log", "w"), stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        pid = until(lambda: ready_pid(run, None))
        print(f"first start: ready after {time.monotonic() - t0:.1f}s (log: {tmp / 'supervise.log'})")
        for k in range(1, a.kills + 1):
            victim = engine(pid)
            what = f"{victim.name()} (pid {victim.pid})"
            t0 = time.monotonic()
            victim.kill()
            seen: dict[str, float] = {}

            def kinds(want: int, seen=seen, t0=t0) -> bool:
                for e in events.read(run.events)[2 * (k - 1):]:
                    seen.setdefault(e.kind, time.monotonic() - t0)
                return len(seen) >= want
            until(lambda: kinds(1))
            until(lambda: kinds(2))
            pid = until(lambda p=pid: ready_pid(run, p))
            ready = time.monotonic() - t0
            until(lambda: completion(url, a.model))
            answered = time.monotonic() - t0
            print(f"kill {k} of {what}: died after {seen['died']:.2f}s, relaunched after "
                  f"{seen['restarted']:.2f}s, ready after {ready:.1f}s, first completion after {answered:.1f}s")
    finally:
        sup.send_signal(signal.SIGTERM)
        sup.wait(timeout=120)


if __name__ == "__main__":
    main()
