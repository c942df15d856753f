"""The weights of a step out to the servers while the next step runs.

When a step ends the trainer takes a snapshot of its shard (``snapshot.Snapshot.take``: a device
copy and cast, no collective) and starts the next step at once; a background thread then either
writes the weights to the run dir (``write_folder``) or broadcasts them to the servers
(``weight_sync.Broadcaster``), bucket by bucket from the snapshot. At most one publish is in flight:
the next snapshot waits for the one before it (``Publisher.submit``). A publish that fails ends
the trainer with one line naming the step and the error (``PublishFailed``, raised in the main
thread at its next step boundary); a planned stop waits for the publish in flight before it
checkpoints (``Publisher.wait``).

The folder (filesystem sync), ``weights/step-N/``: every rank writes the buckets it owns into a
safetensors file of its own (``model-0000r-of-0000n.safetensors``; ``model.safetensors`` on one
rank), streamed bucket by bucket, fsynced; rank 0 writes ``config.json``, the generation config,
the tokenizer and ``model.safetensors.index.json`` (the index any sharded HF checkpoint has, which
transformers and vLLM read). The folder is built as ``.step-N.tmp`` and renamed once every rank's
file is complete; ``READY`` is written (and fsynced) after that, last: a publish cut short leaves
no ``READY``, and the orchestrator, which waits for ``READY`` before it samples from a step's
weights, never sees it.
"""

from __future__ import annotations

import copy
import ctypes
import json
import os
import shutil
import struct
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist

from slurmrl.runtime.step_files import step_name
from slurmrl.runtime.trainer import state
from slurmrl.runtime.trainer.snapshot import Layout, Snapshot, side_group

INDEX = "model.safetensors.index.json"
DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 2**20


def flat_host_memory(threshold: int = MMAP_THRESHOLD) -> bool:
    """Host allocations of ``threshold`` bytes or more are mapped on their own and returned to the
    system when freed. glibc's default raises that threshold as large blocks are freed, after which
    activations of a size that changes from step to step are cut from its heap, which only grows:
    a SmolLM2 RL trainer's resident set rose 8.1 -> 10.0 GiB over 16 steps so. False where the C
    library has no ``mallopt`` (not glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False


class PublishFailed(SystemExit):
    """A background publish failed: the trainer ends with one line naming the step and the error."""

    def __init__(self, step: int, error: BaseException):
        super().__init__(f"slurmrl: trainer: publishing the weights of step {step} failed: "
                         f"{error.__class__.__name__}: {error}")


def file_names(layout: Layout) -> dict[int, str]:
    """The file each writing rank writes (ranks that own no bucket write none)."""
    writers = sorted(set(layout.owners()))
    if len(writers) == 1 and layout.world == 1:
        return {writers[0]: "model.safetensors"}
    return {r: f"model-{i + 1:05d}-of-{len(writers):05d}.safetensors" for i, r in enumerate(writers)}


def header(layout: Layout, buckets: list[int]) -> bytes:
    """The safetensors header of a file holding ``buckets``' tensors in order (8-byte aligned)."""
    meta: dict = {"__metadata__": {"format": "pt"}}
    at = 0
    for k in buckets:
        for i in layout.buckets[k]:
            e = layout.entries[i]
            n = e.numel() * layout.dtype.itemsize
            meta[e.name] = {"dtype": DTYPES[layout.dtype], "shape": list(e.shape), "data_offsets": [at, at + n]}
            at += n
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FolderWriter:
    """What every rank needs to write a step's folder: the layout, the HF files rank 0 adds."""

    def __init__(self, root: Path, snapshot: Snapshot, config, generation_config, tokenizer_src: Path | None,
                 tokenizer, keep: int, log=print):
        self.root, self.snap, self.keep, self.log = root, snapshot, keep, log
        self.config, self.generation_config = config, generation_config
        self.tokenizer_src, self.tokenizer = tokenizer_src, tokenizer
        self.owners = snapshot.layout.owners()
        self.files = file_names(snapshot.layout)

    def _barrier(self) -> None:
        if self.snap.group is not None:
            dist.barrier(group=self.snap.group)

    def write(self, step: int) -> Path:
        """Every rank: its file of ``root/step-N/``; rank 0 the rest, then ``READY`` (collective on
        the side group, in the background thread)."""
        t = time.perf_counter()
        lay = self.snap.layout
        final, tmp = self.root / step_name(step), self.root / f".{step_name(step)}.tmp"
        if lay.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self._barrier()  # the folder exists for every rank
        mine = [k for k, r in enumerate(self.owners) if r == lay.rank]
        writing: Future | None = None
        with ThreadPoolExecutor(max_workers=1) as pool:  # bucket k is written while bucket k + 1 is gathered
            out = open(tmp / self.files[lay.rank], "wb") if mine else None
            try:
                if out is not None:
                    out.write(header(lay, mine))
                for k, owner in enumerate(self.owners):
                    tensors = self.snap.bucket(k, owner)
                    if writing is not None and tensors is not None:
                        writing.result()  # at most one bucket waits while another is written
                    if tensors is not None:
                        assert out is not None, "an owner of a bucket has a file"
                        writing = pool.submit(write_tensors, out, tensors)
                if writing is not None:
                    writing.result()
                if out is not None:
                    out.flush()
                    os.fsync(out.fileno())
            finally:
                if out is not None:
                    out.close()
        if lay.rank == 0:
            self._write_rest(tmp)
        self._barrier()  # every rank's file is complete
        if lay.rank == 0:
            state._swap_in(tmp, final)
            fsync_path(self.root)
            ready = final / "READY"
            ready.write_text(f"{step}\n")
            fsync_path(ready)
            fsync_path(final)
            state.prune(self.root, "READY", self.keep)
            self.log(f"weights of step {step} at {final} ({time.perf_counter() - t:.2f}s, beside the next step)")
        return final

    def _write_rest(self, tmp: Path) -> None:
        lay = self.snap.layout
        weight_map = {lay.entries[i].name: self.files[r] for k, r in enumerate(self.owners) for i in lay.buckets[k]}
        if lay.world > 1 or len(self.files) > 1:
            (tmp / INDEX).write_text(json.dumps({"metadata": {"total_size": lay.bytes}, "weight_map": weight_map},
                                                indent=1) + "\n")
        config = copy.deepcopy(self.config)
        config.tie_word_embeddings = False
        config.dtype = lay.dtype
        config.save_pretrained(tmp)
        if self.generation_config is not None:
            self.generation_config.save_pretrained(tmp)
        copied = False
        if self.tokenizer_src is not None and self.tokenizer_src.is_dir():
            for name in state.TOKENIZER_FILES:
                if (self.tokenizer_src / name).exists():
                    shutil.copy2(self.tokenizer_src / name, tmp / name)
                    copied = True
        if not copied and self.tokenizer is not None:
            self.tokenizer.save_pretrained(tmp)
        for p in tmp.iterdir():
            if p.is_file():
                fsync_path(p)
        fsync_path(tmp)


def write_tensors(out, tensors: list[tuple[str, torch.Tensor]]) -> None:
    """Raw bytes of each tensor, in order, from host memory (no serialized copy of the bucket)."""
    for _, t in tensors:
        out.write(t.contiguous().view(torch.uint8).numpy().data)


def publish_weights(root: Path, step: int, model, config, generation_config, tokenizer_src, tokenizer,
                    dtype: torch.dtype, keep: int, rank: int) -> Path:
    """One publish, waited for (the benchmarks' way; the trainer keeps one ``Publisher`` and
    ``FolderWriter`` and lets each publish run beside the next step). Collective."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    pub = Publisher(model, rank, world, dtype)
    writer = FolderWriter(root, pub.snapshot, config, generation_config, tokenizer_src, tokenizer, keep,
                          log=lambda m: None)
    pub.submit(step, writer.write)
    pub.wait()
    return root / step_name(step)


def broadcast_work(broadcaster, root: Path, keep: int, rank: int, stopping):
    """What a publish does with a broadcast (``weight_sync.Broadcaster``): send, then rank 0 marks
    ``root/step-N/READY`` for the orchestrator (not when a planned stop took the servers down)."""
    def work(step: int) -> float | None:
        took = broadcaster.sync(step, stopping=stopping)
        if took is not None and rank == 0:
            state.mark_broadcast(root, step, keep)
        return took

    return work


class Publisher:
    """At most one publish in flight, in a background thread; its failure fails the trainer."""

    def __init__(self, model: torch.nn.Module, rank: int, world: int, dtype: torch.dtype, log=print,
                 bucket_bytes: int | None = None):
        kw = {} if bucket_bytes is None else {"bucket_bytes": bucket_bytes}
        self.layout = Layout(model, rank, world, dtype=dtype, **kw)
        self.snapshot = Snapshot(model, self.layout, side_group(world))
        self.log = log
        self.thread: threading.Thread | None = None
        self.step = 0
        self.error: BaseException | None = None
        self.took: float | None = None  # seconds the last finished publish ran in the background
        self.previous_s: float | None = None  # the background seconds of the one the last submit waited for
        self.result = None

    def submit(self, step: int, work) -> float:
        """Wait for the publish in flight, snapshot this rank's weights, run ``work(step)`` in the
        background. Seconds the caller was held (waiting + snapshot)."""
        t = time.perf_counter()
        self.previous_s = self.wait()
        self.snapshot.take()
        self.step, self.took, self.result = step, None, None
        self.thread = threading.Thread(target=self._run, args=(step, work), name=f"publish step {step}", daemon=True)
        self.thread.start()
        return time.perf_counter() - t

    def _run(self, step: int, work) -> None:
        t = time.perf_counter()
        try:
            self.result = work(step)
            self.took = time.perf_counter() - t
        except BaseException as e:  # noqa: BLE001 - carried to the trainer's thread
            self.error = e

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def check(self) -> None:
        """Raise ``PublishFailed`` if the last publish failed (no waiting)."""
        if self.error is not None and not self.busy():
            error, self.error = self.error, None
            if isinstance(error, SystemExit):  # already one line that names what failed (a broadcast's)
                raise error
            raise PublishFailed(self.step, error) from error

    def wait(self) -> float | None:
        """Until the publish in flight is done (raises if it failed); its background seconds."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        self.check()
        return self.took
