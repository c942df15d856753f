"""The LM head, log-softmax and entropy over vocabulary chunks: full-vocabulary logits never exist.

``token_logprobs_entropy(hidden, weight, targets)`` is what ``losses.token_logprobs(hidden @
weight.T, targets)`` and ``losses.entropy_sum`` compute, without the [tokens, vocab] logits: the
forward walks the vocabulary in chunks of ``vocab_chunk`` rows of the head (and the tokens in
chunks of ``token_chunk``), keeping per token a running max, sum of exponentials and sum of
exp x logit (an online log-sum-exp), and picks the target's logit in the chunk that holds it. The
backward walks the same chunks again (recomputing each chunk's logits, nothing [tokens, vocab]
is saved) with d logp / d z = onehot - softmax(z). Peak extra memory: one [token_chunk,
vocab_chunk] float32 tile, plus float32 [tokens, hidden] and [vocab_chunk, hidden] accumulators.
Only ``logp`` carries a gradient; the entropy is a metric (no gradient).

``ChunkedHead`` turns a model's ``nn.Linear`` LM head into this in place (same parameter, same
state-dict key, FSDP2 sees the same module): armed with the positions and targets of one forward
(``head.select(...)``), the model's "logits" come back as [N, 2] = (logp, entropy) at those
positions; unarmed it is the plain linear layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

VOCAB_CHUNK = 8192
TOKEN_CHUNK = 8192


def _tiles(n: int, size: int):
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def _acc(weight: torch.Tensor) -> torch.dtype:
    """Sums and softmax in float32 at least (float64 stays float64: the exactness tests)."""
    return torch.promote_types(weight.dtype, torch.float32)


class _ChunkedLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, vocab_chunk: int, token_chunk: int):
        n, v = hidden.shape[0], weight.shape[0]
        h, acc = hidden.to(weight.dtype), _acc(weight)
        m = torch.full((n,), float("-inf"), device=h.device, dtype=acc)
        s = torch.zeros((n,), device=h.device, dtype=acc)
        t = torch.zeros((n,), device=h.device, dtype=acc)
        picked = torch.zeros((n,), device=h.device, dtype=acc)
        for a, b in _tiles(n, token_chunk):
            for c0, c1 in _tiles(v, vocab_chunk):
                z = (h[a:b] @ weight[c0:c1].t()).to(acc)  # [rows, chunk]: the only logits that exist
                m_new = torch.maximum(m[a:b], z.max(dim=1).values)
                scale = torch.exp(m[a:b] - m_new)
                e = torch.exp(z - m_new[:, None])
                s[a:b] = s[a:b] * scale + e.sum(dim=1)
                t[a:b] = t[a:b] * scale + (e * z).sum(dim=1)
                m[a:b] = m_new
                tg = targets[a:b]
                inside = (tg >= c0) & (tg < c1)
                local = (tg - c0).clamp(0, c1 - c0 - 1)
                picked[a:b] += torch.where(inside, z.gather(1, local[:, None]).squeeze(1), 0.0)
                del z, e
        lse = m + torch.log(s)
        logp = picked - lse
        entropy = lse - t / s  # -sum p log p = lse - E_p[z]
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunks = (vocab_chunk, token_chunk)
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, _g_entropy):
        hidden, weight, targets, lse = ctx.saved_tensors
        vocab_chunk, token_chunk = ctx.chunks
        n, v = hidden.shape[0], weight.shape[0]
        h, acc = hidden.to(weight.dtype), _acc(weight)
        g = g_logp.to(acc)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros(hidden.shape, device=h.device, dtype=acc) if need_h else None
        grad_w = torch.empty_like(weight) if need_w else None
        for c0, c1 in _tiles(v, vocab_chunk):
            w = weight[c0:c1]
            gw = torch.zeros(w.shape, device=h.device, dtype=acc) if need_w else None
            for a, b in _tiles(n, token_chunk):
                z = (h[a:b] @ w.t()).to(acc)
                dz = torch.exp(z - lse[a:b, None]).mul_(-g[a:b, None])  # -g * softmax
                tg = targets[a:b]
                inside = (tg >= c0) & (tg < c1)
                rows = inside.nonzero().squeeze(1)
                dz[rows, tg[rows] - c0] += g[a:b][rows]  # + g * onehot
                dz = dz.to(weight.dtype)
                if need_h:
                    grad_h[a:b] += (dz @ w).to(acc)
                if need_w:
                    gw += (dz.t() @ h[a:b]).to(acc)
                del z, dz
            if need_w:
                grad_w[c0:c1] = gw.to(weight.dtype)
        return (grad_h.to(hidden.dtype) if need_h else None), grad_w, None, None, None


def token_logprobs_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                           vocab_chunk: int = VOCAB_CHUNK, token_chunk: int = TOKEN_CHUNK):
    """(log p(targets), entropy) per row of ``hidden`` [N, H] under logits ``hidden @ weight.T``,
    both float32 [N]; the logits are never built whole. ``logp`` carries the gradient."""
    if hidden.shape[0] == 0:  # no targets (a rank's masked micro-batch): zero gradients, but every
        # parameter still gets one, so FSDP2's gradient reduction runs on this rank as on the others
        z = hidden.new_zeros((0,), dtype=_acc(weight)) + (hidden.sum() + weight.sum()) * 0.0
        return z, z.detach()
    return _ChunkedLogprob.apply(hidden, weight, targets, vocab_chunk, token_chunk)


class ChunkedHead(torch.nn.Linear):
    """An LM head that, when armed, returns (logp, entropy) at selected positions instead of logits.

    ``make(linear)`` swaps the class of an existing ``nn.Linear`` (parameters untouched).
    ``select(index, targets)`` arms it for the next forward: ``index`` [N] flat positions into the
    [B*T] hidden states, ``targets`` [N] token ids. The forward consumes the request.
    """

    vocab_chunk: int = VOCAB_CHUNK
    token_chunk: int = TOKEN_CHUNK
    _request: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def make(cls, linear: torch.nn.Linear) -> ChunkedHead:
        if type(linear) is not torch.nn.Linear or linear.bias is not None:
            raise TypeError(f"a chunked LM head needs a bias-free nn.Linear, not {type(linear).__name__}")
        linear.__class__ = cls
        linear._request = None
        return linear

    def select(self, index: torch.Tensor, targets: torch.Tensor) -> None:
        self._request = (index, targets)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._request is None:
            return F.linear(hidden, self.weight)
        index, targets = self._request
        self._request = None
        flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)
        logp, entropy = token_logprobs_entropy(flat, self.weight, targets, self.vocab_chunk, self.token_chunk)
        return torch.stack([logp, entropy], dim=-1)


def supports(model) -> str | None:
    """Why ``model``'s head cannot be chunked (its logits are post-processed, or it is no plain
    linear layer), else None."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(cfg, "final_logit_softcapping", None):
        return "its logits are soft-capped after the head"
    if getattr(cfg, "logit_scale", None) not in (None, 1, 1.0):
        return "its logits are scaled after the head"
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return f"its head is a {type(head).__name__}, not a bias-free linear layer"
    return None


def install(model) -> ChunkedHead:
    head = model.get_output_embeddings()
    return head if isinstance(head, ChunkedHead) else ChunkedHead.make(head)
