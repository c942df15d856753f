"""Weights to the servers by broadcast: vLLM's weight-transfer protocol, driven by the trainer.

With ``trainer.weight_sync`` = ``nccl`` (trainer and servers on different GPUs), ``ipc`` (on the
same GPU) or ``gloo`` (no GPU: slurmrl's engine, ``slurmrl.runtime.vllm.gloo_transfer``) the servers
start with ``--weight-transfer-config '{"backend": ...}'`` and, after each step, the trainer

1. pauses every server (running requests finish; new ones wait),
2. runs vLLM's trainer-side engine for the backend: ``/start_weight_update``, ``/update_weights``
   on every server while rank 0 broadcasts the weights (from the trainer's snapshot, in a
   background thread beside the next step: each bucket's rows are gathered from every rank to
   rank 0, sent, and freed: ``SnapshotSource``), ``/finish_weight_update``,
3. drops every server's prefix cache and resumes them,
4. writes ``weights/step-N/READY`` (no weights in it): generation of the next batch waits for it.

The group (``/init_weight_transfer_engine`` on every server, the trainer rank 0 at
``master_address:master_port``, every worker of server i at ``rank_offset`` 1 + the workers of the
servers before it: ``slurmrl.runtime.vllm.client.WeightSync``) is over the live set of servers: before
every sync rank 0 forms it again when the orchestrator's live set changed (a server dead, one restarted
in place or joined and waiting for the weights), dropping a server that does not join in time, and
records which servers took the step's weights (``transfer_group``). A sync that does not finish within
``timeout_s``, or a server that stops answering during one, ends the trainer with a message naming
the servers that are down (or the timeout).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource, materialize_full_tensor
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

from slurmrl.contract.weight_sync import Broadcast
from slurmrl.runtime.trainer.snapshot import Snapshot
from slurmrl.runtime.trainer.transfer_group import NotFormed, TransferGroup
from slurmrl.runtime.vllm import plugin
from slurmrl.runtime.vllm.client import VLLMError, WeightSync
from slurmrl.runtime.vllm.gloo_transfer import GlooTrainerInitInfo


class SyncFailed(SystemExit):
    """A broadcast did not reach every server: the trainer ends with one line naming what failed."""

    def __init__(self, message: str):
        super().__init__(f"slurmrl: trainer: {message}")


class ModelSource(WeightSource):
    """The trainer's parameters as the servers load them: full tensors (an FSDP shard is gathered,
    a collective every rank runs in the same order), in ``dtype`` (bfloat16)."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, cast_in_engine: bool = False):
        self.model, self.dtype, self.cast_in_engine = model, dtype, cast_in_engine

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, self.dtype, tuple(p.shape)) for name, p in self.model.named_parameters()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full tensors as the model holds them: the engine casts to ``dtype`` as it packs (gloo) or
        before it sends (vLLM's engines check the dtype: cast here for them)."""
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                full = materialize_full_tensor(p.detach())
                yield name, full if self.cast_in_engine else full.to(self.dtype)


class SnapshotSource(WeightSource):
    """The trainer's weights from its snapshot (``snapshot.Snapshot``), bucket by bucket: every rank
    sends its rows of a bucket to rank 0, which yields the bucket's full tensors (in the snapshot's
    dtype) and frees them before the next. The other ranks yield nothing: iterating drives their
    part of the gathers, as vLLM's engines do on every rank that is not the sender."""

    def __init__(self, snapshot: Snapshot, device: torch.device | None = None):
        self.snapshot, self.device = snapshot, device

    def metadata(self) -> list[ParamMeta]:
        lay = self.snapshot.layout
        return [ParamMeta(e.name, lay.dtype, e.shape) for e in lay.entries]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for k in range(len(self.snapshot.layout.buckets)):
            for name, t in self.snapshot.bucket(k, 0) or ():
                yield name, t if self.device is None else t.to(self.device)  # NCCL/IPC send from the GPU


@dataclass(frozen=True)
class Target:
    """Where the weights go: the backend and timeout (the plan's ``Broadcast``), the servers (and their
    workers), the group's address."""

    sync: Broadcast
    urls: list[str]
    ranks: list[int]  # worker processes per server, in the order of urls
    master_address: str
    master_port: int
    world_size: int  # what the plan says: 1 + every server's workers
    live: Path | None = None  # the orchestrator's live set (None: every planned server, always)
    synced: Path | None = None  # where rank 0 records which servers took each step's weights

    @property
    def backend(self) -> str:
        return self.sync.backend

    @property
    def timeout_s(self) -> float:
        return float(self.sync.timeout_s)

    def connect(self, model: torch.nn.Module, rank: int, dtype: torch.dtype, log=print,
                snapshot: Snapshot | None = None) -> Broadcaster:
        """Open the transfer group with every server (every trainer rank calls it). With ``snapshot``
        the weights are sent from it (in ``snapshot.layout.dtype``), else from the model itself."""
        source = None
        if snapshot is not None:
            source = SnapshotSource(snapshot, None if self.sync.ours else snapshot.device)  # NCCL and IPC send from the GPU
        return Broadcaster(self, model, rank, dtype, log, source)

    def check(self) -> WeightSync:
        sync = WeightSync(self.urls, self.ranks, timeout=self.timeout_s)
        if sync.world_size != self.world_size:
            raise SyncFailed(f"{len(self.urls)} servers with {sum(self.ranks)} workers make a transfer group of "
                             f"{sync.world_size}, but the plan says {self.world_size}")
        return sync


def init_info(t: Target, rank: int, world_size: int | None = None):
    """The trainer-side init info of vLLM's engine for ``t.backend`` (gloo: ours), for a group of ``world_size``
    (default: the plan's)."""
    world_size = t.world_size if world_size is None else world_size
    if t.sync.ours:
        return GlooTrainerInitInfo(master_address=t.master_address, master_port=t.master_port,
                                   world_size=world_size, timeout_s=t.timeout_s, rank=rank)
    if t.sync.between_gpus:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(master_address=t.master_address, master_port=t.master_port,
                                   world_size=world_size, rank=rank)
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

    return IPCTrainerInitInfo(rank=rank)


class Broadcaster:
    """One trainer's connection to every server; ``sync()`` on every rank after each step."""

    def __init__(self, target: Target, model: torch.nn.Module, rank: int, dtype: torch.dtype = torch.bfloat16,
                 log=print, source: WeightSource | None = None):
        """``source``: where the weights come from (default: the model itself, gathered one tensor
        at a time in the caller's thread; the trainer passes its snapshot's ``SnapshotSource``)."""
        plugin.register()  # the gloo backend, in this process too
        self.target, self.rank, self.log = target, rank, log
        self.client = target.check()
        self.source = source or ModelSource(model, dtype, cast_in_engine=target.sync.ours)
        self.bytes = sum(m.dtype.itemsize * int(torch.Size(m.shape).numel()) for m in self.source.metadata())
        t = time.perf_counter()
        self.group: TransferGroup | None = None
        if rank != 0:  # not in the group: its part is the gathers its source runs
            self.engine = WeightTransferTrainerFactory.trainer_init(init_info(target, rank), client=self.client,
                                                                    source=self.source)
            return
        self.group = TransferGroup(dict(zip(target.urls, target.ranks)), target.live, target.timeout_s,
                                   lambda world: init_info(target, 0, world), self.source, log, target.sync.ours)
        self._guard("opening the transfer group", self.group.ensure, self.group.limit_s)
        self.client = self.group.client or self.client  # the group's: what each sync drives (until it is formed again)
        log(f"weight transfer ({target.backend}) to {len(self.group.urls)} server(s) of {len(target.urls)}, "
            f"at {target.master_address}:{target.master_port}, opened in {time.perf_counter() - t:.2f}s")

    @property
    def engine(self):
        return self.group.engine if self.group is not None else self._engine

    @engine.setter
    def engine(self, value) -> None:
        self._engine = value

    def sync(self, step: int, stopping=lambda: False) -> float | None:
        """Every server on this model's weights; seconds. Collective over the trainer's ranks.
        None when it failed while ``stopping()`` (a planned stop takes the servers down too: the
        checkpoint keeps the weights, and the next attempt broadcasts them first)."""
        t = time.perf_counter()
        group = self.group
        try:
            for again in (False, True):
                if group is not None:
                    try:
                        self._pause(group)
                    except SyncFailed:
                        self._drain()
                        raise
                    if group.client is None:  # no server is live: the next update reaches those that come back
                        self._drain()
                        why = "; ".join(f"{u}: {w}" for u, w in group.dropped.items()) or "none in the live set"
                        self.log(f"weights of step {step} reached no server: none is live ({why})")
                        group.record(self.target.synced, step)
                        return time.perf_counter() - t
                try:
                    self._guard(f"sending the weights of step {step}", self.engine.send_weights)
                    break
                except SyncFailed as e:
                    # a server that died after its pause, before the update started: nothing was sent
                    # (no rank has read its weights yet), so the update starts again over those that answer
                    if again or group is None or not getattr(group.client, "unstarted", False):
                        raise
                    self.log(f"weight transfer: {e.code}; nothing was sent: the group is formed again over "
                             "the servers that answer")
                    group.key = None
            if group is not None:
                self._resume(group, step)
                group.record(self.target.synced, step)
        except SyncFailed as e:
            if not stopping():
                raise
            self.log(f"weights of step {step} not sent, the job is stopping ({e.code})")
            return None
        return time.perf_counter() - t

    def _pause(self, group: TransferGroup) -> None:
        """The group over the live servers, paused; a server that died since the group was formed (its pause
        fails) is probed out and the group formed again, once."""
        for again in (False, True):
            self._guard("forming the transfer group over the live servers", group.ensure, group.limit_s)
            if group.client is None:
                return
            self.client = group.client
            try:
                self._guard("pausing", self.client.pause)
                return
            except SyncFailed as e:
                if again:
                    raise
                self.log(f"weight transfer: {e.code}; the group is formed again over the servers that answer")
                group.key = None  # those that paused are paused again (a no-op) and resumed after the update

    def _resume(self, group: TransferGroup, step: int) -> None:
        """Every member takes requests again. A server that died after the weights reached it (its resume
        fails, its /health does not answer) is the orchestrator's to declare dead and restart: the update
        stands for the others, and the next one forms the group again over the servers live then."""
        try:
            self._guard("resuming", self.client.resume)
        except SyncFailed as e:
            gone = self.client.dead()
            if not gone:
                raise
            self.log(f"weights of step {step} sent; {e.code}: left to the orchestrator, the group is formed "
                     "again at the next update")
            group.key = None

    def _drain(self) -> None:
        for _ in self.source:  # the other ranks' gathers still need this rank's shards
            pass

    def _guard(self, what: str, fn, limit_s: float | None = None):
        """``fn()`` within ``limit_s`` (the timeout); a failure or a hang names the servers that are down."""
        done, out, err = threading.Event(), [], []

        def run():
            try:
                out.append(fn())
            except BaseException as e:  # noqa: BLE001 - carried to the caller's thread
                err.append(e)
            finally:
                done.set()

        threading.Thread(target=run, name=f"weight-sync: {what}", daemon=True).start()
        limit_s = self.target.timeout_s if limit_s is None else limit_s
        if not done.wait(limit_s):
            raise SyncFailed(f"weight transfer ({self.target.backend}): {what} did not finish within "
                             f"{limit_s:g}s{self._down()}")
        if err:
            e = err[0]
            if isinstance(e, NotFormed):
                raise SyncFailed(f"weight transfer ({self.target.backend}): {e}") from e
            reason = str(e) if isinstance(e, VLLMError) else f"{e.__class__.__name__}: {e}"
            raise SyncFailed(f"weight transfer ({self.target.backend}): {what} failed: {reason}{self._down()}") from e
        return out[0] if out else None

    def _down(self) -> str:
        if self.rank != 0:
            return ""
        dead = self.client.dead()
        return f"; server(s) not answering: {', '.join(dead)}" if dead else ""
