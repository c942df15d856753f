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

"Every server" is every live one (``members``): the loads run on the admitted servers, one request chain per
server at once; a server that fails and does not answer its ``/health`` is declared dead and skipped, never
waited on. A server that comes back gets the weights the others serve (``admit``) before it is readmitted:
with a broadcast, the trainer's next update reaches it (its group is formed again over the live set the
orchestrator writes) and the trainer's record says so (``slurmrl.contract.live_set``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from slurmrl.contract import live_set
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.orchestrator import adapters, hybrid
from slurmrl.runtime.orchestrator.members import Members, probe
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

    def admit(self, url: str) -> bool:
        """A server that came back: the weights the others serve loaded into it (False: it cannot have them)."""


class Serves(Protocol):
    adapter: str | None  # the name requests ask for instead of the served model's (a LoRA policy's adapter)


class Broadcast:
    """The trainer broadcasts the weights to every server of its group itself (the live set: the admitted and
    the waiting, ``slurmrl.contract.live_set``); generation only waits for its ``READY``. A server that came
    back (or joined) is admitted once the trainer's record says a broadcast of the step the others serve (or a
    later one) reached it; one the trainer dropped from the group is declared dead."""

    def __init__(self, backend: str, members: Members, synced: Path, log: Log):
        self.backend, self.members, self.synced, self.log = backend, members, synced, log
        self.step = 0

    def resume(self, written: int, published: int) -> None:
        pass

    def take(self, step: int, path: Path | None) -> float:
        self.step = step
        reached = live_set.read_reached(self.synced)
        dropped = reached.dropped if reached is not None and reached.step == step else {}
        for url, why in dropped.items():
            self.members.declare_dead(url, f"dropped from the broadcast of step {step}: {why}")
        self.log(f"servers now on weights of step {step} (broadcast by the trainer, {self.backend})")
        return 0.0

    def hand_over(self) -> float | None:
        return None

    def admit(self, url: str) -> bool:
        """True once the trainer's last broadcast, of this step or a later one, reached ``url``; False until then."""
        reached = live_set.read_reached(self.synced)
        return reached is not None and reached.step >= self.step and url in reached.urls


class FilesystemReload:
    """Every live server reloads the folder the trainer published."""

    def __init__(self, members: Members, log: Log):
        self.members, self.log = members, log
        self.step = 0
        self.path: Path | None = None  # the weights the servers serve (None: the base model they started with)

    def resume(self, written: int, published: int) -> None:
        pass

    def load(self, urls: list[str], step: int, path: Path) -> str:
        """Load ``path`` on the servers ``urls``; what the log line adds (empty here)."""
        reload_weights(urls, str(path))
        return ""

    def on_live(self, fn: Callable[[list[str]], str]) -> str:
        """``fn([url])`` on every admitted server at once; a server that fails and does not answer is declared
        dead; what ``fn`` returned, or one ``VLLMError`` naming each live server that failed."""
        urls = self.members.admitted()
        with ThreadPoolExecutor(max_workers=max(1, min(64, len(urls)))) as pool:
            futures = {u: pool.submit(fn, [u]) for u in urls}
        errors, note = [], ""
        for u, f in futures.items():
            try:
                note = f.result()
            except VLLMError as e:
                cause = probe(u)
                if not cause:
                    errors.append(str(e))
                self.members.declare_dead(u, f"{cause} (during the weight update: {str(e)[:200]})")
        if errors:
            raise VLLMError("; ".join(errors))
        return note

    def take(self, step: int, path: Path | None) -> float:
        assert path is not None, "latest_weights names the folder of each step it finds"
        t = time.perf_counter()
        self.step, self.path = step, path  # what a server that comes back loads
        try:
            note = self.on_live(lambda urls: self.load(urls, step, path))
        except VLLMError as e:
            raise VLLMError(f"weight update failed: {e}", e.answer) from None
        took = time.perf_counter() - t
        self.log(f"servers now on weights of step {step}{note} ({took:.2f}s)")
        return took

    def hand_over(self) -> float | None:
        return None

    def admit(self, url: str) -> bool:
        if self.path is not None:
            t = time.perf_counter()
            self.load([url], self.step, self.path)
            self.log(f"{url} now on weights of step {self.step} ({time.perf_counter() - t:.2f}s)")
        return True


class HybridReload(FilesystemReload):
    """The servers and the trainer take turns on the same GPUs: asleep while it steps, woken on the new weights."""

    def resume(self, written: int, published: int) -> None:
        if written > published:  # batches the trainer has yet to step on: the (restarted, awake) servers give it the GPUs
            hybrid.sleep(self.members.admitted())
            self.log(f"servers asleep: the trainer steps on batches {published + 1}..{written} first")

    def load(self, urls: list[str], step: int, path: Path) -> str:
        hybrid.wake_and_reload(urls, str(path))
        return ""

    def hand_over(self) -> float | None:
        return max(hybrid.sleep(self.members.admitted()).values(), default=0.0)


class AdapterHotLoad(FilesystemReload):
    """A LoRA policy: every server hot-loads each step's adapter under a new name, which the samplers then ask for."""

    def __init__(self, members: Members, samplers: Sequence[Serves], log: Log):
        super().__init__(members, log)
        self.samplers = samplers
        self.current: str | None = None  # the adapter the servers serve the policy as (None: the base model)

    def load(self, urls: list[str], step: int, path: Path) -> str:
        """A server that comes back serves the base model only: it loads the adapter, nothing to unload."""
        name = adapters.swap(urls, path, step, self.current)  # every server unloads the same previous adapter
        return f" (adapter {name})"

    def take(self, step: int, path: Path | None) -> float:
        took = super().take(step, path)
        self.current = adapters.adapter_name(step)
        for sampler in self.samplers:
            sampler.adapter = self.current
        return took


def pick(s: OrchestratorSettings, members: Members, samplers: Sequence[Serves], log: Log) -> WeightUpdate:
    """The job's weight-update strategy: the one place that reads the weight-sync mode."""
    backend = s.weight_sync.describe() if s.weight_sync.by_broadcast else None  # the trainer's broadcast backend
    if backend is not None:
        return Broadcast(backend, members, RunDir(s.root).synced, log)
    if s.hybrid:
        return HybridReload(members, log)
    if s.lora:
        return AdapterHotLoad(members, samplers, log)
    return FilesystemReload(members, log)
