"""The hybrid engine (``placement.colocate = "hybrid"``): vLLM and the trainer take turns on the same GPUs.

The servers run with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1`` (the planner writes
both in job.sbatch), which gives them ``POST /sleep``, ``POST /wake_up``, ``GET /is_sleeping``
beside ``/collective_rpc``; with ``inference.auth = "job_secret"`` every one of them needs the
job's secret, which ``slurmrl.runtime.vllm.client`` sends. One training step:

    orchestrator: generate batch s  ->  sleep(level 2) every server  ->  write rollouts/step-s.json
    trainer:      read the batch, train, return cached GPU memory, publish weights/step-s (READY)
    orchestrator: wake_up(tags=weights) -> reload_weights(weights/step-s) -> wake_up(tags=kv_cache)
                  on every server, then generate batch s + 1

Level 2 drops the weights and the KV cache instead of copying the weights to CPU (level 1): they
are replaced by the trainer's next weights anyway, so waking only the weights' memory, loading
the new ones into it and then waking the KV cache is all a step needs (vLLM keeps the model's
buffers, e.g. rotary tables, across a level-2 sleep). A server that is awake (it started, or
restarted after a requeue, with the base model) reloads the usual way (``Server.reload_weights``:
pause, reload, resume). vLLM's sleep mode needs CUDA: its CPU build refuses ``--enable-sleep-mode``.
"""

from __future__ import annotations

import time

from slurmrl.runtime.vllm.client import Server, VLLMError, each

LEVEL = 2  # drop weights and KV cache: the next weights come from the trainer


def sleep_one(server: Server, level: int = LEVEL) -> float:
    """Put one server to sleep once its running requests finish (``mode=wait``); seconds taken."""
    t = time.perf_counter()
    server.sleep(level)
    if not server.is_sleeping():
        raise VLLMError(f"{server.base}/sleep: answered, but the server says it is not sleeping")
    return time.perf_counter() - t


def wake_one(server: Server, weights_dir: str) -> float:
    """Wake one server on the weights in ``weights_dir``: asleep, wake the weights' memory, load
    into it, then wake the KV cache (which resumes scheduling); awake, reload as usual."""
    t = time.perf_counter()
    if not server.is_sleeping():
        server.reload_weights(weights_dir)
        return time.perf_counter() - t
    server.wake_up("weights")
    server.load_weights(weights_dir)
    server.wake_up("kv_cache")
    if server.is_sleeping():
        raise VLLMError(f"{server.base}/wake_up: weights and KV cache woken, but the server still says it sleeps")
    return time.perf_counter() - t


def sleep(urls: list[str], level: int = LEVEL) -> dict[str, float]:
    """Every server to sleep, in parallel; seconds per server (VLLMError names the ones that failed)."""
    return each(urls, lambda server: sleep_one(server, level))


def wake_and_reload(urls: list[str], weights_dir: str) -> dict[str, float]:
    """Every server awake on ``weights_dir``, in parallel; seconds per server."""
    return each(urls, lambda server: wake_one(server, weights_dir))
