"""The trainer's process group: this rank's device (``cuda:LOCAL_RANK`` with NCCL, or the CPU with
gloo), and the few collectives the loop asks of it."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from slurmrl.contract import job_env


def hide_gpus() -> None:
    """No CUDA device for this process: availability checks answer from NVML and see none
    (torch's NVML-based check initializes no CUDA context, so it is safe after a fork)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"


class Dist:
    def __init__(self, dtype: str):
        # SLURMRL_TRAINER_DEVICE=cpu keeps a run (the tests, a debug run on a GPU node) off the GPUs,
        # and away from CUDA altogether: a process forked from one that touched CUDA (the tests'
        # warm fork) must never initialize it again, and torch's optimizer asks is_available().
        off = job_env.trainer_on_cpu()
        if off:
            hide_gpus()
        self.cuda = not off and torch.cuda.is_available()
        self.rank = int(os.environ.get("RANK", 0))
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.local = int(os.environ.get("LOCAL_RANK", 0))
        self.device = torch.device("cuda", self.local) if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        backend = "nccl" if self.cuda else "gloo"
        timeout = datetime.timedelta(minutes=60)
        if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, timeout=timeout, device_id=self.device if self.cuda else None)
        else:  # started without torchrun: a group of one
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        self.bf16 = dtype == "bfloat16" and self.cuda and torch.cuda.is_bf16_supported()

    def any(self, flag: bool) -> bool:
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def sum(self, values: list[float | torch.Tensor]) -> list[float]:
        t = torch.stack([torch.as_tensor(v, dtype=torch.float64).to(self.device) for v in values])
        dist.all_reduce(t)
        return t.tolist()
