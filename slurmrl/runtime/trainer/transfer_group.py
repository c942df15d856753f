"""The trainer's weight-transfer group over the live set of servers, formed again when that set changes.

Before every update, rank 0 reads the orchestrator's live set (``RUN_DIR/servers-live.json``,
``slurmrl.contract.live_set``; none of this attempt: every planned server) and takes every server that is
admitted or waiting for the weights (it came back, or joined), probes each (``/health``, a 5 s deadline:
one that does not answer is dropped from this update) and, when the set or a server's incarnation (a
restart in place: same URL, a new process outside any group) differs from the group's, forms the group
again over them: a new world size, each server's workers at new rank offsets, vLLM's
``/init_weight_transfer_engine`` on each, every rank given ``JOIN_S`` (at most a quarter of the sync's
timeout) to join. A server whose init fails early, or answers that it joined a group that did not form, or that stops
answering, has not joined in time: it is dropped
and the group is formed over the rest, never waited on; when no one can be named, the servers new to the
group are dropped. After the update, ``Reached`` (``RUN_DIR/servers-synced.json``) says which servers
took the weights of the step and which were dropped and why: the orchestrator admits a waiting server
once it is there (it never serves before it has the weights the others serve), and declares a dropped
admitted one dead.

gloo (slurmrl's engine) keeps its TCP store from group to group, each forming under keys of its own.
vLLM's NCCL and IPC engines are shut down and opened again over the new group (on the same port:
only a GPU machine with vLLM can show that this works; not shown yet).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from vllm.distributed.weight_transfer.base import WeightSource
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

from slurmrl.contract import live_set
from slurmrl.contract.job_env import attempt_from_env
from slurmrl.runtime.vllm.client import Server, VLLMError, WeightSync
from slurmrl.runtime.vllm.gloo_transfer import GlooTrainerWeightTransferEngine

JOIN_S = 60.0  # how long a forming waits for every rank (at most the sync's timeout)
HEALTH_S = 5.0
EARLY = 0.5  # an init that failed within this share of the join deadline failed on its own (not by waiting)


class NotFormed(RuntimeError):
    """No group could be formed; the message names why."""


class Forming(WeightSync):
    """``WeightSync`` whose init records, per server, how long it took to fail."""

    def __init__(self, urls: list[str], ranks: list[int], timeout: float):
        super().__init__(urls, ranks, timeout)
        self.failed: dict[str, tuple[float, str]] = {}  # url -> (seconds until it failed, why)
        self.answered: set[str] = set()  # the servers whose init said it had joined
        self.unstarted = False  # an update's start failed: no weight was sent, it may start again without one

    def start_weight_update(self) -> None:
        """Every server starts the update. When one fails (it died after its pause), no weight has been sent:
        those that started end it with nothing loaded (vLLM puts their weights back), so that the update can
        start again over the servers that answer."""
        started: list[str] = []
        errors: list[str] = []

        def one(url: str) -> None:
            try:
                Server(url, self.timeout).start_weight_update()
                started.append(url)
            except VLLMError as e:
                errors.append(str(e))

        with ThreadPoolExecutor(max_workers=max(1, min(64, len(self.urls)))) as pool:
            list(pool.map(one, self.urls))
        if errors:
            self.unstarted = True
            with ThreadPoolExecutor(max_workers=max(1, min(64, len(started)))) as pool:
                list(pool.map(self._abandon, started))
            raise VLLMError("; ".join(errors))

    def _abandon(self, url: str) -> None:
        try:
            Server(url, self.timeout).finish_weight_update()
        except VLLMError:
            pass  # it stops answering too: the next forming probes it out

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        t = time.monotonic()

        def one(url: str) -> None:
            info = init_info if "world_size" not in init_info else {**init_info, "rank_offset": self.offsets[url]}
            try:
                Server(url, self.timeout).init_weight_transfer(info)
                self.answered.add(url)
            except VLLMError as e:
                self.failed[url] = (time.monotonic() - t, str(e))

        with ThreadPoolExecutor(max_workers=max(1, min(64, len(self.urls)))) as pool:
            list(pool.map(one, self.urls))
        if self.failed:
            raise VLLMError("; ".join(why for _, why in self.failed.values()))


def healthy(urls: list[str]) -> dict[str, bool]:
    with ThreadPoolExecutor(max_workers=max(1, min(64, len(urls)))) as pool:
        return dict(zip(urls, pool.map(lambda u: Server(u).health(timeout=HEALTH_S), urls)))


class TransferGroup:
    """Rank 0's group. ``planned``: every server of the plan and its workers (``{url: ranks}``); ``live``: the
    live set's file (None: the planned servers, always); ``init(world_size)``: the backend's trainer init info
    for a group of ``world_size``; ``source``: the weights; ``ours``: the backend is gloo (slurmrl's engine)."""

    def __init__(self, planned: dict[str, int], live: Path | None, timeout_s: float, init: Callable,
                 source: WeightSource, log: Callable[[str], None], ours: bool):
        self.planned, self.live, self.timeout_s, self.init, self.source, self.log, self.ours = \
            planned, live, timeout_s, init, source, log, ours
        self.key: tuple[tuple[str, int], ...] | None = None
        self.engine: Any = None  # the backend's trainer-side engine
        self.client: WeightSync | None = None
        self.dropped: dict[str, str] = {}  # this update's: url -> why

    @property
    def urls(self) -> list[str]:
        return list(self.client.urls) if self.client is not None else []

    @property
    def join_s(self) -> float:
        return min(JOIN_S, self.timeout_s / 4)

    @property
    def limit_s(self) -> float:
        """The most one ``ensure`` can take: a forming per server it may drop, and the sync's timeout."""
        return self.timeout_s + (self.join_s + HEALTH_S) * (len(self.planned) + 1)

    def wanted(self) -> list[tuple[str, int]]:
        """(url, incarnation) of every server the update goes to, in plan order; the unknown and the silent
        ones are in ``dropped``."""
        now = live_set.read_live(self.live) if self.live is not None else None
        if now is None or now.attempt != attempt_from_env():
            members = [(u, 0) for u in self.planned]
        else:
            members = [(m.url, m.incarnation) for m in now.in_group()]
        for url, _ in members:
            if url not in self.planned:
                self.dropped[url] = "not one of the job's planned servers (its workers are unknown to the trainer)"
        members = [(u, n) for u, n in members if u in self.planned]
        up = healthy([u for u, _ in members])
        for url, ok in up.items():
            if not ok:
                self.dropped[url] = f"/health did not answer 200 within {HEALTH_S:g}s"
        return [(u, n) for u, n in members if up[u]]

    def ensure(self) -> None:
        """The group over the servers that are live now (formed again if they changed); drops who fails."""
        self.dropped = {}
        want = self.wanted()
        key = tuple(want)
        if key == self.key and self.formed:
            return
        before = set(self.urls)
        while True:
            urls = [u for u, _ in want]
            if not urls:
                self.close()
                self.key = key
                return
            try:
                self.form(urls)
                self.key = tuple(want)
                return
            except (VLLMError, RuntimeError) as e:
                out = self.culprits(urls, self.client, before)
                if not out:
                    self.close()
                    raise NotFormed(f"the transfer group over {', '.join(urls)} was not formed: {e}") from e
                for url, why in out.items():
                    self.dropped[url] = why
                self.log(f"weight transfer: dropped from the group: {'; '.join(f'{u} ({w})' for u, w in out.items())}")
                want = [(u, n) for u, n in want if u not in out]

    def culprits(self, urls: list[str], client: WeightSync | None, before: set[str]) -> dict[str, str]:
        """The servers that did not join in time: those whose init failed early, those whose init said they had
        joined a group that did not form (a real member's returns only once every rank is in), those that
        stopped answering; else those new to the group."""
        failed = client.failed if isinstance(client, Forming) else {}
        out = {u: f"did not join the group: {why[:200]}" for u, (took, why) in failed.items()
               if took < EARLY * self.join_s}
        if isinstance(client, Forming):
            out.update({u: "its init answered, but it never joined the group" for u in client.answered})
        up = healthy(urls)
        out.update({u: "stopped answering while the group was formed" for u in urls if not up[u]})
        if not out:
            out = {u: f"did not join the group within {self.join_s:g}s" for u in urls if u not in before}
        return out

    def form(self, urls: list[str]) -> None:
        t = time.perf_counter()
        client = Forming(urls, [self.planned[u] for u in urls], self.timeout_s)
        self.client = client
        if self.ours:  # one engine and store for the trainer's life, a group per forming
            if self.engine is None:
                self.engine = GlooTrainerWeightTransferEngine.open(self.init(client.world_size), client=client,
                                                                   source=self.source)
            self.engine.regroup(client, client.world_size, self.join_s)
        else:
            if self.engine is not None:
                self.engine.shutdown()
            self.engine = None
            self.engine = WeightTransferTrainerFactory.trainer_init(self.init(client.world_size), client=client,
                                                                    source=self.source)
        self.log(f"weight transfer group of {client.world_size} over {len(urls)} server(s) formed in "
                 f"{time.perf_counter() - t:.2f}s: {', '.join(urls)}")

    def close(self) -> None:
        """No group (gloo's engine and store stay for the next forming: its port is the plan's)."""
        if self.engine is not None and not self.ours:
            self.engine.shutdown()
            self.engine = None
        elif self.engine is not None:
            self.engine.group = None
        self.client = None

    @property
    def formed(self) -> bool:
        return self.client is not None and (not self.ours or self.engine.group is not None)

    def record(self, path: Path | None, step: int) -> None:
        """Which servers took the weights of ``step``, which were dropped (the orchestrator reads it)."""
        if path is not None:
            live_set.write(path, live_set.Reached(step, tuple(self.urls), dict(self.dropped)))
