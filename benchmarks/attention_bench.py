"""Which kernel should run per-document attention on this device? Times each candidate on one packed
row, forward + backward, and checks it against the per-document reference. Prints figures; asserts nothing.

The trainer's fast path (``runtime/trainer/doc_attention.py``) runs PyTorch's varlen flash attention
(FlashAttention-2 class) on CUDA. On one H200 at the Qwen3-0.6B shape it took about 1.7 s of a 2.8 s
step (docs/rl.md), and a plain causal SDPA loop ran faster on the same card: this bench is how to
choose its successor by measurement. Candidates (each skipped, with the reason, where it cannot run):

- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` over the whole row (what the trainer runs);
- ``sdpa-cudnn`` / ``sdpa-flash`` / ``sdpa-efficient``: causal ``scaled_dot_product_attention`` per
  document under that one backend (cuDNN's is the FlashAttention-3 class on Hopper);
- ``flex``: FlexAttention with a causal document ``BlockMask``, compiled;
- ``sdpa-math``: the per-document reference (CPU: the trainer's own path).

    python benchmarks/attention_bench.py                          # CUDA: Qwen3-0.6B heads, 4 x 16,384
    .venv/bin/python benchmarks/attention_bench.py --docs 3 --doc-len 256 --iters 2   # CPU
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # torch < 2.10
    varlen_attn = None


def per_document(q, k, v, bounds, backend=None):
    """q [1, H, T, D], k/v [1, Hk, T, D] -> [1, H, T, D], causal inside each document."""
    outs = []
    gqa = q.shape[1] != k.shape[1]
    for a, b in itertools.pairwise(bounds):
        if backend is None:
            outs.append(F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], is_causal=True,
                                                       enable_gqa=gqa))
        else:
            with sdpa_kernel([backend]):
                kk, vv = k[:, :, a:b], v[:, :, a:b]
                if gqa and backend != SDPBackend.MATH:  # not every backend takes enable_gqa
                    kk = kk.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
                    vv = vv.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
                    outs.append(F.scaled_dot_product_attention(q[:, :, a:b], kk, vv, is_causal=True))
                else:
                    outs.append(F.scaled_dot_product_attention(q[:, :, a:b], kk, vv, is_causal=True, enable_gqa=gqa))
    return torch.cat(outs, dim=2)


def varlen(q, k, v, bounds):
    cu = torch.tensor(bounds, dtype=torch.int32, device=q.device)
    longest = max(b - a for a, b in itertools.pairwise(bounds))
    group = q.shape[1] // k.shape[1]
    qt, kt, vt = (x[0].transpose(0, 1).contiguous() for x in (q, k, v))
    kt, vt = kt.repeat_interleave(group, dim=1), vt.repeat_interleave(group, dim=1)
    out = varlen_attn(qt, kt, vt, cu, cu, longest, longest, is_causal=True)
    return out.transpose(0, 1).unsqueeze(0)


def flex_fn(bounds, heads: int, t: int, device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc = torch.zeros(t, dtype=torch.int32, device=device)
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        doc[a:b] = i

    def causal_doc(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    mask = create_block_mask(causal_doc, None, None, t, t, device=device)
    compiled = torch.compile(flex_attention) if device.type == "cuda" else flex_attention

    def run(q, k, v, _bounds):
        return compiled(q, k, v, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])

    return run


def candidates(args, bounds, device):
    out = {}
    if device.type == "cuda":
        out["varlen"] = varlen if varlen_attn is not None else "torch has no varlen_attn"
        for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION)):
            out[name] = (lambda b: lambda q, k, v, bd: per_document(q, k, v, bd, b))(backend)
    try:
        out["flex"] = flex_fn(bounds, args.heads, bounds[-1], device)
    except Exception as e:  # noqa: BLE001 - a candidate that cannot run is reported, not fatal
        out["flex"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
    out["sdpa-math"] = lambda q, k, v, bd: per_document(q, k, v, bd, SDPBackend.MATH if device.type == "cuda" else None)
    return out


def timed(fn, q, k, v, bounds, grad, iters: int, sync) -> tuple[float, torch.Tensor, tuple]:
    out = None
    for i in range(iters + 1):  # the first call warms up (compile, autotune), not counted
        if i == 1:
            sync()
            start = time.perf_counter()
        for x in (q, k, v):
            x.grad = None
        out = fn(q, k, v, bounds)
        out.backward(grad)
    sync()
    return (time.perf_counter() - start) / iters, out.detach(), tuple(x.grad.clone() for x in (q, k, v))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--doc-len", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    # documents of unequal length, as packed rows hold them (the mean stays --doc-len)
    lens = [max(1, args.doc_len + (i - args.docs // 2) * args.doc_len // (2 * args.docs)) for i in range(args.docs)]
    bounds = [0, *itertools.accumulate(lens)]
    t = bounds[-1]
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(h):
        return torch.randn(1, h, t, args.head_dim, generator=g).to(device, dtype).requires_grad_()

    q, k, v = rand(args.heads), rand(args.kv_heads), rand(args.kv_heads)
    grad = torch.randn(1, args.heads, t, args.head_dim, generator=g).to(device, dtype)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    print(f"per-document attention on {name}, torch {torch.__version__}, {dtype}: {args.docs} documents "
          f"({min(lens)}-{max(lens)} tokens, {t} in the row), {args.heads}/{args.kv_heads} heads x {args.head_dim}")
    flops = sum(4 * n * n / 2 * args.heads * args.head_dim for n in lens) * 3.5  # causal fwd + bwd (2.5x fwd)
    ref = None
    rows = []
    for cname, fn in candidates(args, bounds, device).items():
        if isinstance(fn, str):
            rows.append((cname, None, fn))
            continue
        try:
            sec, out, grads = timed(fn, q, k, v, bounds, grad, args.iters, sync)
        except Exception as e:  # noqa: BLE001 - reported per candidate
            rows.append((cname, None, f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"))
            continue
        rows.append((cname, sec, (out, grads)))
        if cname == "sdpa-math":
            ref = (out, grads)
    print(f"{'kernel':>15} {'fwd+bwd ms':>11} {'TFLOP/s':>8} {'max |out - ref|':>15} {'max |dq - ref|':>15}")
    for cname, sec, res in rows:
        if sec is None:
            print(f"{cname:>15}  skipped: {res}")
            continue
        out, grads = res
        d_out = (out.float() - ref[0].float()).abs().max().item() if ref else float("nan")
        d_q = (grads[0].float() - ref[1][0].float()).abs().max().item() if ref else float("nan")
        print(f"{cname:>15} {sec * 1000:11.2f} {flops / sec / 1e12:8.1f} {d_out:15.2e} {d_q:15.2e}")


if __name__ == "__main__":
    main()
