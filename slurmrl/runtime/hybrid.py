"""The hybrid engine (``placement.colocate = "hybrid"``): vLLM and the trainer take turns on the same GPUs.

The servers run with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1`` (the planner writes
both in job.sbatch), which gives them ``POST /sleep``, ``POST /wake_up``, ``GET /is_sleeping``
beside ``/collective_rpc``; with ``inference.auth = "job_secret"`` every one of them needs the
job's secret, which ``admin.post`` and ``get`` here send. One training step:

    orchestrator: generate batch s  ->  sleep(level 2) every server  ->  write rollouts/step-s.json
    trainer:      read the batch, train, return cached GPU memory, publish weights/step-s (READY)
    orchestrator: wake_up(tags=weights) -> reload_weights(weights/step-s) -> wake_up(tags=kv_cache)
                  on every server, then generate batch s + 1

Level 2 drops the weights and the KV cache instead of copying the weights to CPU (level 1): they
are replaced by the trainer's next weights anyway, so waking only the weights' memory, loading
the new ones into it and then waking the KV cache is all a step needs (vLLM keeps the model's
buffers, e.g. rotary tables, across a level-2 sleep). A server that is awake (it started, or
restarted after a requeue, with the base model) reloads the usual way (``admin.reload_one``:
pause, reload, resume). vLLM's sleep mode needs CUDA: its CPU build refuses ``--enable-sleep-mode``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from slurmrl import secret
from slurmrl.runtime import admin

LEVEL = 2  # drop weights and KV cache: the next weights come from the trainer


def get(url: str, timeout: float = 60.0) -> bytes:
    req = urllib.request.Request(url, headers=secret.headers())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        raise admin.AdminError(f"{url}: HTTP {e.code}: {e.read()[:300].decode(errors='replace')}") from None
    except OSError as e:
        raise admin.AdminError(f"{url}: {e}") from None


def is_sleeping(base: str) -> bool:
    url = f"{base}/is_sleeping"
    try:
        return bool(json.loads(get(url))["is_sleeping"])
    except (ValueError, KeyError, TypeError):
        raise admin.AdminError(f"{url}: not a vLLM sleep-mode answer (is VLLM_SERVER_DEV_MODE=1 set?)") from None


def sleep_one(base: str, level: int = LEVEL) -> float:
    """Put one server to sleep once its running requests finish (``mode=wait``); seconds taken."""
    t = time.perf_counter()
    admin.post(f"{base}/sleep?level={level}&mode=wait")
    if not is_sleeping(base):
        raise admin.AdminError(f"{base}/sleep: answered, but the server says it is not sleeping")
    return time.perf_counter() - t


def wake_one(base: str, weights_dir: str) -> float:
    """Wake one server on the weights in ``weights_dir``: asleep, wake the weights' memory, load
    into it, then wake the KV cache (which resumes scheduling); awake, reload as usual."""
    t = time.perf_counter()
    if not is_sleeping(base):
        admin.reload_one(base, weights_dir)
        return time.perf_counter() - t
    admin.post(f"{base}/wake_up?tags=weights")
    admin.post(f"{base}/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": weights_dir}})
    admin.post(f"{base}/wake_up?tags=kv_cache")
    if is_sleeping(base):
        raise admin.AdminError(f"{base}/wake_up: weights and KV cache woken, but the server still says it sleeps")
    return time.perf_counter() - t


def sleep(urls: list[str], level: int = LEVEL) -> dict[str, float]:
    """Every server to sleep, in parallel; seconds per server (AdminError names the ones that failed)."""
    return admin._each(urls, lambda base: sleep_one(base, level))


def wake_and_reload(urls: list[str], weights_dir: str) -> dict[str, float]:
    """Every server awake on ``weights_dir``, in parallel; seconds per server."""
    return admin._each(urls, lambda base: wake_one(base, weights_dir))
