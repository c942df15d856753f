"""Metrics that debug a training step, from what the step computes anyway (no second forward pass).

- ``RLStats``: per micro-batch sums and maxima of the RL step's token statistics (KL to the
  reference and to the inference engine, entropy, clip fraction, importance ratio), reduced over
  ranks once per step.
- ``memory()``: the device allocator's figures (CUDA) and the process's resident memory.
- ``Flops``: model FLOPs per step and MFU = achieved model FLOP/s per device / the device's peak.
- ``reward_stats()``: mean, std, min and max of a batch's rewards.

docs/rl.md "Metrics that debug RL" lists every field and its formula.
"""

from __future__ import annotations

import resource
import statistics
import sys

import torch
import torch.distributed as dist

from slurmrl.runtime.trainer import losses
from slurmrl.runtime.trainer.mesh_apply import SLICE

GIB = 2.0**30

# Peak dense bfloat16 tensor-core TFLOP/s per GPU from the vendors' datasheets (no sparsity), most
# specific name first: a device whose name contains the key. Float32 training, other GPUs and CPUs
# have no entry: MFU is then left out unless trainer.peak_tflops gives the peak.
PEAK_BF16_TFLOPS = (
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("A100", 312.0),
)


def k3(d: torch.Tensor) -> torch.Tensor:
    """The k3 KL estimator per token, d = log q - log p at a token sampled from p: e^d - d - 1 >= 0."""
    d = d.clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


class RLStats:
    """Sums and maxima over the target tokens of one RL step, on this rank; ``finish`` reduces them."""

    SUMS = ("loss", "kl", "kl_inference", "entropy", "clip", "masked", "ratio")
    MAXES = ("kl", "kl_inference")

    def __init__(self, device: torch.device):
        self.device = device
        self.sums = {k: torch.zeros((), device=device, dtype=torch.float64) for k in self.SUMS}
        self.maxes = {k: torch.zeros((), device=device, dtype=torch.float64) for k in self.MAXES}
        self.has_ref = False

    @torch.no_grad()
    def add(self, terms: dict, logits: torch.Tensor, sel: torch.Tensor, logp: torch.Tensor, old: torch.Tensor,
            ref_logp: torch.Tensor | None) -> None:
        """One micro-batch: ``terms`` from ``losses.ppo_clip_terms``, ``logits`` [B, T, V] before the
        targets ``sel`` [B, T], ``logp``/``old``/``ref_logp`` at the selected tokens."""
        self.add_tokens(terms, losses.token_entropy(logits, sel), logp, old, ref_logp)

    @torch.no_grad()
    def add_tokens(self, terms: dict, entropy: torch.Tensor, logp: torch.Tensor, old: torch.Tensor,
                   ref_logp: torch.Tensor | None) -> None:
        """One micro-batch as the trainer's fast path has it: ``entropy``, ``logp``, ``old`` and
        ``ref_logp`` per target token (the chunked head computes the entropy with the logprob)."""
        logp = logp.detach()
        d_inf = torch.where(torch.isnan(old), logp, old) - logp  # missing inference logprob: no divergence
        kl_inf = k3(d_inf)
        self.sums["kl_inference"] += kl_inf.sum().double()
        self._max("kl_inference", kl_inf)
        if ref_logp is not None:
            self.has_ref = True
            kl = k3(ref_logp - logp)
            self.sums["kl"] += kl.sum().double()
            self._max("kl", kl)
        self.sums["entropy"] += entropy.detach().sum().double()
        for k in ("loss", "clip", "masked", "ratio"):
            self.sums[k] += terms[k].detach().double()

    def _max(self, key: str, values: torch.Tensor) -> None:
        if values.numel():
            self.maxes[key] = torch.maximum(self.maxes[key], values.max().double())

    def finish(self, n_targets: int) -> dict:
        """Means over the step's ``n_targets`` target tokens and maxima, over every rank (collective)."""
        sums = torch.stack([self.sums[k] for k in self.SUMS])
        maxes = torch.stack([self.maxes[k] for k in self.MAXES])
        if dist.is_initialized():
            dist.all_reduce(sums)
            dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
        s = dict(zip(self.SUMS, sums.tolist()))
        m = dict(zip(self.MAXES, maxes.tolist()))
        n = max(1, n_targets)
        return {
            "loss": s["loss"] / n,
            "kl": s["kl"] / n if self.has_ref else None,  # no reference model: no KL to it
            "kl_max": m["kl"] if self.has_ref else None,
            "kl_inference": s["kl_inference"] / n, "kl_inference_max": m["kl_inference"],
            "entropy": s["entropy"] / n, "clip_frac": s["clip"] / n,
            "masked_frac": s["masked"] / n, "ratio_mean": s["ratio"] / n,
        }


def reward_stats(rewards: list[float]) -> dict:
    return {"reward_mean": statistics.fmean(rewards), "reward_std": statistics.pstdev(rewards),
            "reward_min": min(rewards), "reward_max": max(rewards)}


# ---- memory --------------------------------------------------------------------------------
def rss_bytes() -> int:
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:
        return 0


def peak_rss_bytes() -> int:
    """The process's largest resident set since it started (getrusage; kB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory(device: torch.device) -> dict:
    """GiB, the largest over ranks (collective when distributed): the CUDA caching allocator's
    allocated / reserved / peak-allocated-this-step where the device is a GPU, and the process's
    resident set (now, and its peak since start) everywhere."""
    names, values = ["cpu_rss_gib", "cpu_rss_peak_gib"], [rss_bytes(), peak_rss_bytes()]
    if device.type == "cuda":
        names += ["cuda_mem_allocated_gib", "cuda_mem_reserved_gib", "cuda_mem_peak_gib"]
        values += [torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device),
                   torch.cuda.max_memory_allocated(device)]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {n: round(v / GIB, 4) for n, v in zip(names, t.tolist())}


# ---- MFU -----------------------------------------------------------------------------------
def flop_params(model) -> int:
    """N: the parameters a token's forward pass multiplies with, i.e. all but the input embedding
    table (a lookup). FSDP2's sharded parameters count whole (DTensor.numel is the global size), and
    so do expert slices (``mesh_apply``: a slice times ``ep``)."""
    total = sum(p.numel() * getattr(p, SLICE, (0, 1, 0))[1] for p in model.parameters())
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return total - (emb.weight.numel() if emb is not None else 0)


def peak_tflops(device: torch.device, bf16: bool, setting: float | None) -> tuple[float | None, str]:
    """(peak dense TFLOP/s of one device, where that figure comes from)."""
    if setting is not None:
        return setting, "trainer.peak_tflops"
    if device.type != "cuda":
        return None, f"unknown on {device.type} (set trainer.peak_tflops for MFU)"
    name = torch.cuda.get_device_name(device)
    if not bf16:
        return None, f"unknown for float32 on {name} (set trainer.peak_tflops for MFU)"
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in name:
            return tflops, f"{name}, bfloat16 dense, datasheet"
    return None, f"unknown for {name} (set trainer.peak_tflops for MFU)"


class Flops:
    """Model FLOPs of a step: 6·N per trained token (forward 2·N, backward 4·N) plus 2·N per token
    through a frozen reference model; attention's score FLOPs and activation recomputation are not
    counted (MFU, not hardware FLOPs utilization)."""

    def __init__(self, n_params: int, world: int, peak: float | None):
        self.n, self.world, self.peak = n_params, world, peak

    def step(self, tokens: int, ref_tokens: int = 0) -> float:
        return 6.0 * self.n * tokens + 2.0 * self.n * ref_tokens

    def record(self, tokens: int, ref_tokens: int, seconds: float) -> dict:
        """``model_tflops_per_device`` = FLOPs / seconds / devices / 1e12; ``mfu`` = that / peak (None when
        the peak is unknown)."""
        if seconds <= 0:
            return {"model_tflops_per_device": None, "mfu": None}
        per_device = self.step(tokens, ref_tokens) / seconds / self.world / 1e12
        return {"model_tflops_per_device": per_device, "mfu": per_device / self.peak if self.peak else None}
