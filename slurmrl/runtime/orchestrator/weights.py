"""How the inference servers take up the trainer's newest weights: one strategy per job, picked once as
the orchestrator starts (``pick``, the only place that reads the weight-sync mode).

- ``Broadcast`` (``trainer.weight_sync`` a broadcast backend): the trainer has sent the weights to every
  server itself and ``weights/step-N/`` holds only its ``READY``; nothing is loaded here.
- ``FilesystemReload``: every server reloads ``weights/step-N/`` (pause, reload, resume: ``vllm.client``).
- ``HybridReload`` (``placement.colocate = "hybrid"``): the servers sleep while the trainer steps; each
  wakes its weights' memory, loads the new weights into it, then wakes its KV cache (``hybrid``). Before a
  batch is handed to the trainer, every server goes to sleep.
- ``AdapterHotLoad`` (``[trainer.lora]``): ``weights/step-N/`` is a PEFT adapter; every server hot-loads it
  under a new name, the previous one is unloaded, and the samplers ask for the new name (``adapters``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from slurmrl.runtime.orchestrator import adapters, hybrid
from slurmrl.runtime.vllm.client import VLLMError, reload_weights
from slurmrl.settings.orchestrator import OrchestratorSettings

Log = Callable[[str], None]


class WeightUpdate(Protocol):
    def resume(self, written: int, published: int) -> None:
        """After a requeue, with ``written`` batches on disk and the trainer's weights at step ``published``."""

    def take(self, step: int, path: Path | None) -> float:
        """Every server on the weights of trainer step ``step`` (published at ``path``); seconds the servers took."""

    def hand_over(self) -> float | None:
        """Before a batch is written: what the servers give up for the trainer; seconds (None: nothing)."""


class Serves(Protocol):
    adapter: str | None  # the name requests ask for instead of the served model's (a LoRA policy's adapter)


class Broadcast:
    """The trainer broadcasts the weights to every server itself; generation only waits for its ``READY``."""

    def __init__(self, backend: str, log: Log):
        self.backend, self.log = backend, log

    def resume(self, written: int, published: int) -> None:
        pass

    def take(self, step: int, path: Path | None) -> float:
        self.log(f"servers now on weights of step {step} (broadcast by the trainer, {self.backend})")
        return 0.0

    def hand_over(self) -> float | None:
        return None


class FilesystemReload:
    """Every server reloads the folder the trainer published."""

    def __init__(self, admin_urls: list[str], log: Log):
        self.urls, self.log = admin_urls, log

    def resume(self, written: int, published: int) -> None:
        pass

    def load(self, step: int, path: Path) -> str:
        """Load ``path`` on every server; what the log line adds (empty here)."""
        reload_weights(self.urls, str(path))
        return ""

    def take(self, step: int, path: Path | None) -> float:
        assert path is not None, "latest_weights names the folder of each step it finds"
        t = time.perf_counter()
        try:
            note = self.load(step, path)
        except VLLMError as e:
            raise VLLMError(f"weight update failed: {e}", e.answer) from None
        took = time.perf_counter() - t
        self.log(f"servers now on weights of step {step}{note} ({took:.2f}s)")
        return took

    def hand_over(self) -> float | None:
        return None


class HybridReload(FilesystemReload):
    """The servers and the trainer take turns on the same GPUs: asleep while it steps, woken on the new weights."""

    def resume(self, written: int, published: int) -> None:
        if written > published:  # batches the trainer has yet to step on: the (restarted, awake) servers give it the GPUs
            hybrid.sleep(self.urls)
            self.log(f"servers asleep: the trainer steps on batches {published + 1}..{written} first")

    def load(self, step: int, path: Path) -> str:
        hybrid.wake_and_reload(self.urls, str(path))
        return ""

    def hand_over(self) -> float | None:
        return max(hybrid.sleep(self.urls).values())


class AdapterHotLoad(FilesystemReload):
    """A LoRA policy: every server hot-loads each step's adapter under a new name, which the samplers then ask for."""

    def __init__(self, admin_urls: list[str], samplers: Sequence[Serves], log: Log):
        super().__init__(admin_urls, log)
        self.samplers = samplers
        self.current: str | None = None  # the adapter the servers serve the policy as (None: the base model)

    def load(self, step: int, path: Path) -> str:
        self.current = adapters.swap(self.urls, path, step, self.current)
        for sampler in self.samplers:
            sampler.adapter = self.current
        return f" (adapter {self.current})"


def pick(s: OrchestratorSettings, admin_urls: list[str], samplers: Sequence[Serves], log: Log) -> WeightUpdate:
    """The job's weight-update strategy: the one place that reads the weight-sync mode."""
    backend = s.weight_sync.describe() if s.weight_sync.by_broadcast else None  # the trainer's broadcast backend
    if backend is not None:
        return Broadcast(backend, log)
    if s.hybrid:
        return HybridReload(admin_urls, log)
    if s.lora:
        return AdapterHotLoad(admin_urls, samplers, log)
    return FilesystemReload(admin_urls, log)
