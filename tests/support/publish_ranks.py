"""One trainer rank for tests/test_publish.py (``torchrun --nproc-per-node=2 tests/support/publish_ranks.py
MODEL OUT BUCKET_BYTES``): the model made ready as the trainer makes it (FSDP2 over gloo), one
optimizer step so the weights differ from the files they came from, then one publish of step 1
through the trainer's own ``Publisher`` and ``FolderWriter``. Rank 0 also saves the full state
(gathered the old way) as ``OUT/expected.pt``, and every rank its peak resident set above what it
held when the background write began, and when the buckets went to rank 0 as a broadcast sends
them (``OUT/peak-rank<R>.json``; rank 0 a digest of each tensor it assembled, ``OUT/sent.json``)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

os.environ["SLURMRL_TRAINER_DEVICE"] = "cpu"

import torch  # noqa: E402

from slurmrl.runtime.trainer import numerics, state  # noqa: E402
from slurmrl.runtime.trainer.dist import Dist  # noqa: E402
from slurmrl.runtime.trainer.mesh import TrainerMesh  # noqa: E402
from slurmrl.runtime.trainer.model import load_model  # noqa: E402
from slurmrl.runtime.trainer.publish import FolderWriter, Publisher, flat_host_memory  # noqa: E402
from slurmrl.settings.trainer import Parallel  # noqa: E402


def digest(tensor: torch.Tensor) -> str:
    """sha256 of the tensor's bytes, read in place (no copy that would count in the peak)."""
    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy()).hexdigest()


def vm_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main() -> None:
    model_dir, out, bucket = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    flat_host_memory()
    torch.manual_seed(0)
    d = Dist("float32")
    replicate = int(sys.argv[4]) if len(sys.argv) > 4 else 1  # HSDP: this many copies of the model
    mesh = TrainerMesh(Parallel(dp_replicate=replicate), d.world, d.rank)
    model, _ = load_model(str(model_dir), d, False, mesh=mesh)
    optim = numerics.optimizer(list(model.parameters()), 1e-2, 0.0, False)
    ids = torch.randint(0, 50, (1, 32))
    model(input_ids=ids).logits.float().pow(2).mean().backward()
    optim.step()
    optim.zero_grad(set_to_none=True)
    expected = state.full_model_state(model)
    if d.rank == 0:
        torch.save(expected, out / "expected.pt")
    del expected
    pub = Publisher(model, d.rank, d.world, torch.float32, bucket_bytes=bucket)
    writer = FolderWriter(out / "weights", pub.snapshot, model.config, None, model_dir, None, keep=2)
    pub.snapshot.take()
    # a first write (not measured) pays the one-time costs: lazy imports, the writer's thread, the
    # allocator's first arenas. Step 1 is the folder the tests read; the measured write is step 2.
    writer.write(1)
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from here
    before = vm_kib("VmRSS")
    writer.write(2)
    peak = vm_kib("VmHWM")
    # the broadcast's way (weight_sync.SnapshotSource): every bucket to rank 0, which hands it on and drops it
    Path("/proc/self/clear_refs").write_text("5")
    before_send = vm_kib("VmRSS")
    sent = {}
    for k in range(len(pub.layout.buckets)):
        tensors: list | None = pub.snapshot.bucket(k, 0) or []
        for name, tensor in tensors:
            sent[name] = digest(tensor)
        tensors = tensor = None  # as a sender drops a bucket once it is on the wire
    peak_send = vm_kib("VmHWM")
    if d.rank == 0:
        (out / "sent.json").write_text(json.dumps(sent))
    (out / f"peak-rank{d.rank}.json").write_text(json.dumps({
        "peak_above_kib": peak - before, "send_peak_above_kib": peak_send - before_send, "buckets": len(pub.layout.buckets), "model_bytes": pub.layout.bytes,
        "largest_bucket": max(pub.layout.bucket_bytes_of(k) for k in range(len(pub.layout.buckets)))}))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
