"""RL batches: read ``rollouts/step-NNNNNN.json`` (``slurmrl.contract.rollouts``), split it over ranks and micro-batches.

A sample is ``prompt_ids + completion_ids`` (cut to ``seq_len``); a micro-batch's samples are
packed end to end into one row (``packing.PackedRow``: no padding, attention per sample).
Targets are the completion tokens; the row's ``old_logp`` column holds the inference logprob at
each completion token (NaN where it is missing), its ``advantage`` column the sample's advantage,
its ``experts`` the experts vLLM routed each token to, when the samples carry them
(``router_replay``). A multi-turn sample's ``completion_mask`` (1: the model's token, 0: the
environment's) keeps the environment's tokens in the row, attended to but never targets.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from slurmrl.contract.reader import ContractError
from slurmrl.contract.rollouts import RolloutBatch, Sample
from slurmrl.runtime.trainer import router_replay
from slurmrl.runtime.trainer.packing import PackedRow, pack_documents


def read_batch(path: Path) -> RolloutBatch:
    """The batch at ``path``; a batch that breaks the contract stops the trainer with one line naming the key."""
    for attempt in range(50):  # the file is renamed into place, but a shared filesystem may lag
        try:
            return RolloutBatch.read(path)
        except (json.JSONDecodeError, FileNotFoundError):
            if attempt == 49:
                raise
            time.sleep(0.2)
        except ContractError as e:
            raise SystemExit(f"slurmrl: trainer: {e}") from None
    raise AssertionError("unreachable")


def _packed(samples: Sequence[Sample], seq_len: int, dummy: bool) -> PackedRow:
    docs, old, adv = [], [], []
    for s in samples:
        p, c = list(s.prompt_ids), list(s.completion_ids)
        ids = (p + c)[:seq_len]
        own = [bool(m) and not dummy for m in s.mask()]
        docs.append((ids, ([False] * len(p) + own)[:seq_len]))
        old.append(([math.nan] * len(p) + s.old_logprobs())[:seq_len])
        adv.append([s.advantage] * len(ids))
    row = pack_documents(docs, {"old_logp": old, "advantage": adv})
    if any(s.routed_experts for s in samples):  # return_routed_experts: what the MoE replays
        recorded = [router_replay.decode(s.routed_experts) if s.routed_experts else None for s in samples]
        shape = next(np.shape(r) for r in recorded if r)
        row.experts = router_replay.per_token(recorded, [len(ids) for ids, _ in docs], shape[1], shape[2])
    return row


def target_tokens(samples: Sequence[Sample], seq_len: int) -> int:
    """Completion tokens that are loss targets, over the whole batch (as ``_packed`` marks them)."""
    n = 0
    for s in samples:
        p = len(s.prompt_ids)
        n += sum(m for k, m in enumerate(s.mask()) if max(p, 1) <= p + k < seq_len)
    return n


def split(samples: Sequence[Sample], rank: int, world: int, micro: int, seq_len: int) -> list[PackedRow]:
    """This rank's micro-batches, each ``micro`` samples packed into one row. Every rank gets the
    same number (collectives stay in step); a rank short of samples gets a masked copy of one (no
    loss, no tokens)."""
    mine = samples[rank::world]
    n_micro = max(1, math.ceil(math.ceil(len(samples) / world) / micro))
    out = []
    for k in range(n_micro):
        chunk = mine[k * micro : (k + 1) * micro]
        out.append(_packed(chunk, seq_len, False) if chunk else _packed(samples[:1], seq_len, True))
    return out
