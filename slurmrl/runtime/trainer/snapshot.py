"""A copy of this rank's shard of the weights, and the buckets that assemble full tensors from it.

After a step the trainer copies (and casts, on the device) the part of every weight that this rank
holds into one flat buffer it keeps from step to step (``Snapshot.take``: no collective for FSDP2's
``Shard(0)`` parameters, no allocation after the first step). The next step then runs while a
background thread turns the copy into full tensors, one bucket at a time (``Snapshot.bucket``):
every rank sends its rows of the bucket's tensors to the bucket's destination over a gloo group of
the trainer's ranks kept for this (``side_group``: the training step's collectives stay on the
default group), which concatenates them. Buckets hold consecutive tensors up to ``bucket_bytes``
(a larger tensor alone), so at most about two buckets of full tensors exist at once: the one being
gathered and the one being written or sent. Nothing here gathers the whole model.

How the rows are spread: an FSDP2 parameter (``DTensor``, ``Shard(0)`` on a 1-D mesh) holds rows
``[offset_r, offset_r + rows_r)`` on rank r (every rank's row count is exchanged once, at start); a
DTensor placed otherwise is made whole on every rank and cut as ``torch.chunk`` cuts it; a plain
tensor (one rank, or a buffer FSDP2 leaves whole) is taken from rank 0 alone; an expert slice
(``mesh_apply``: experts split over ``ep`` ranks, outside FSDP2) is taken from the first expert
group's ranks, whose slices in rank order are the full ``[experts, ...]`` tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from slurmrl.runtime.buckets import buckets
from slurmrl.runtime.trainer.mesh_apply import SLICE

BUCKET_BYTES = 32 * 2**20
GATHER_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Entry:
    """One tensor as the servers load it: its full shape, and the rows each rank holds."""

    name: str
    shape: tuple[int, ...]
    rows: tuple[int, ...]  # per rank, along dim 0 (a 0-d tensor counts one row)
    start: int  # where this rank's part begins in the flat snapshot, in elements

    @property
    def row_numel(self) -> int:
        return math.prod(self.shape[1:]) if self.shape else 1

    def numel(self, rank: int | None = None) -> int:
        return (sum(self.rows) if rank is None else self.rows[rank]) * self.row_numel


def weight_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter, then every persistent buffer, by its state-dict name (what a checkpoint holds)."""
    out = list(model.named_parameters())
    for mod_name, mod in model.named_modules():
        for name, buf in mod.named_buffers(recurse=False):
            if buf is not None and name not in mod._non_persistent_buffers_set:
                out.append((f"{mod_name}.{name}" if mod_name else name, buf))
    return out


def _placement(t: torch.Tensor) -> str:
    """'shard0' (rows spread by FSDP2), 'dtensor' (made whole, then cut), 'expert' (an expert slice)
    or 'plain' (rank 0 holds it)."""
    if hasattr(t, SLICE):
        return "expert"
    placements = getattr(t, "placements", None)
    if placements is None:
        return "plain"
    from torch.distributed.tensor import Shard

    return "shard0" if len(placements) == 1 and isinstance(placements[0], Shard) and placements[0].dim == 0 \
        and t.dim() > 0 else "dtensor"


def _local(t: torch.Tensor, kind: str, rank: int, world: int) -> torch.Tensor:
    """This rank's rows of ``t`` (a collective for 'dtensor': every rank calls it in the same order)."""
    if kind == "expert":  # the first expert group's slices (replica 0), in rank order
        return t.detach() if _replica(t) == 0 else t.detach()[:0]
    t = t.detach()
    if kind == "shard0":
        return t.to_local()  # type: ignore[attr-defined]
    if kind == "dtensor":
        full = t.full_tensor()  # type: ignore[attr-defined]
        if full.dim() == 0:
            return full.reshape(1) if rank == 0 else full.reshape(0)
        return full.chunk(world)[rank] if rank < len(full.chunk(world)) else full[:0]
    flat = t.reshape(1) if t.dim() == 0 else t
    return flat if rank == 0 else flat[:0]


def _replica(t: torch.Tensor) -> int:
    return int(getattr(t, SLICE)[2])


def _full_shape(t: torch.Tensor, kind: str) -> tuple[int, ...]:
    """The shape the servers load: an expert slice's rows times ``ep``."""
    if kind == "expert":
        return (t.shape[0] * getattr(t, SLICE)[1], *t.shape[1:])
    return tuple(t.shape)


class Layout:
    """Which rows of which tensor every rank holds, and the buckets. Built collectively, once."""

    def __init__(self, model: torch.nn.Module, rank: int, world: int, bucket_bytes: int = BUCKET_BYTES,
                 dtype: torch.dtype = torch.bfloat16):
        self.rank, self.world, self.dtype, self.bucket_bytes = rank, world, dtype, bucket_bytes
        named = weight_tensors(model)
        self.kinds = [_placement(t) for _, t in named]
        mine = [int(_local(t, k, rank, world).shape[0]) if k != "dtensor" else -1
                for (_, t), k in zip(named, self.kinds)]
        for i, ((_, t), k) in enumerate(zip(named, self.kinds)):
            if k == "dtensor":
                n = t.shape[0] if t.dim() else 1
                chunks = [len(c) for c in torch.arange(n).chunk(world)]
                mine[i] = chunks[rank] if rank < len(chunks) else 0
        every: list[list[int]] = [mine] * world
        if world > 1:
            every = [[] for _ in range(world)]
            dist.all_gather_object(every, mine)
        self.entries: list[Entry] = []
        start = 0
        for i, (name, t) in enumerate(named):
            e = Entry(name, _full_shape(t, self.kinds[i]), tuple(r[i] for r in every), start)
            self.entries.append(e)
            start += e.numel(rank)
        self.local_numel = start
        self.buckets = buckets([e.numel() * dtype.itemsize for e in self.entries], bucket_bytes)

    @property
    def bytes(self) -> int:
        return sum(e.numel() for e in self.entries) * self.dtype.itemsize

    def bucket_bytes_of(self, k: int) -> int:
        return sum(self.entries[i].numel() for i in self.buckets[k]) * self.dtype.itemsize

    def owners(self) -> list[int]:
        """The rank that writes each bucket: each one to the rank with the fewest bytes so far."""
        load, out = [0] * self.world, []
        for k in range(len(self.buckets)):
            r = min(range(self.world), key=lambda x: (load[x], x))
            load[r] += self.bucket_bytes_of(k)
            out.append(r)
        return out


def side_group(world: int):
    """A gloo group of every trainer rank for the background gathers (collective; None on one rank)."""
    if world == 1:
        return None
    import datetime

    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=GATHER_TIMEOUT_S))


class Snapshot:
    """This rank's rows of every weight in ``layout.dtype``, in one buffer on the model's device."""

    def __init__(self, model: torch.nn.Module, layout: Layout, group=None):
        self.model, self.layout, self.group = model, layout, group
        device = next(model.parameters()).device
        self.device = device
        self.buffer = torch.empty(layout.local_numel, dtype=layout.dtype, device=device)
        self.ready = torch.cuda.Event() if device.type == "cuda" else None
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.staging: list[torch.Tensor] = []  # pinned host memory for two buckets' rows (CUDA)

    def take(self) -> None:
        """Copy (and cast) this rank's rows into the buffer: on the device, in the caller's stream."""
        lay = self.layout
        with torch.no_grad():
            for e, kind, (_, t) in zip(lay.entries, lay.kinds, weight_tensors(self.model)):
                part = _local(t, kind, lay.rank, lay.world)
                self.buffer[e.start : e.start + e.numel(lay.rank)].view(part.shape).copy_(part)
        if self.ready is not None:
            self.ready.record()

    def _rows(self, k: int) -> torch.Tensor:
        """This rank's rows of bucket k, one contiguous range of the buffer, in host memory."""
        idx = self.layout.buckets[k]
        first, last = self.layout.entries[idx[0]], self.layout.entries[idx[-1]]
        part = self.buffer[first.start : last.start + last.numel(self.layout.rank)]
        if self.device.type != "cuda":
            return part
        assert self.stream is not None and self.ready is not None, "set for a CUDA snapshot"
        if not self.staging:  # bucket k in k % 2: on one rank its views are still being written while k + 1 comes
            self.staging = [torch.empty(self._largest(), dtype=part.dtype, pin_memory=True) for _ in range(2)]
        host = self.staging[k % 2][: part.numel()]
        with torch.cuda.stream(self.stream):  # beside the next step's kernels, after the snapshot's copy
            self.stream.wait_event(self.ready)
            host.copy_(part, non_blocking=True)
        self.stream.synchronize()
        return host

    def _largest(self) -> int:
        lay = self.layout
        return max(sum(lay.entries[i].numel(lay.rank) for i in idx) for idx in lay.buckets)

    def bucket(self, k: int, dst: int) -> list[tuple[str, torch.Tensor]] | None:
        """Bucket k's full tensors on rank ``dst`` (host memory; None elsewhere). Every rank calls
        it for the same k in the same order (a gather over the side group)."""
        lay = self.layout
        idx = lay.buckets[k]
        rows = self._rows(k)
        if lay.world == 1:
            return self._split([rows], idx)
        sizes = [sum(lay.entries[i].numel(r) for i in idx) for r in range(lay.world)]
        width = max(sizes)
        mine = rows if rows.numel() == width else torch.cat([rows, rows.new_zeros(width - rows.numel())])
        pieces = [torch.empty(width, dtype=rows.dtype) for _ in range(lay.world)] if lay.rank == dst else None
        dist.gather(mine, pieces, dst=dst, group=self.group)
        del mine, rows  # a padded copy: gone before the bucket is assembled
        if pieces is None:
            return None
        return self._split([p[:n] for p, n in zip(pieces, sizes)], idx)

    def _split(self, pieces: list[torch.Tensor], idx: range) -> list[tuple[str, torch.Tensor]]:
        """Full tensors from every rank's rows (one rank: views of its own, no copy)."""
        at = [0] * len(pieces)
        out = []
        for i in idx:
            e = self.layout.entries[i]
            parts = []
            for r, p in enumerate(pieces):
                n = e.numel(r)
                parts.append(p[at[r] : at[r] + n])
                at[r] += n
            flat = parts[0] if len(parts) == 1 else torch.cat(parts)
            out.append((e.name, flat.view(e.shape)))
        return out
