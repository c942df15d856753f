"""The rollout batch: ``RUN_DIR/rollouts/step-NNNNNN.json``, written by the orchestrator for training
step N and read by the trainer (standard library only: both sides import it).

    {"step": N, "policy_step": V, "samples": [{"prompt_ids": [...], "completion_ids": [...],
     "logprobs": [...], "routed_experts": "...", "completion_mask": [...], "reward": R, "advantage": A}]}

``step`` is the training step the batch is for, ``policy_step`` the trainer step whose weights
generated it (0: the base model). Per sample: the prompt's and the completion's token ids, the
inference logprob at each completion token (null where there is none: an environment's token of a
multi-turn sample), the reward and the group-relative advantage. Two keys only some samples carry:
``routed_experts`` (vLLM's experts per token, base64 ``.npy``: ``inference.return_routed_experts``)
and ``completion_mask`` (1 at the model's tokens, 0 at the environment's: chat environments).

Each key is spelled once, as a field name below: ``to_json`` writes the fields in order (an optional
one only when set), ``from_json`` reads them back and names the file and the key that is missing or
of the wrong type in a one-line ``ContractError`` (``slurmrl.contract.reader``, the kit every reader here uses).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from slurmrl.contract.reader import TEXT, TOP, WHOLE, Wrong, fields_of, kind, number, parse, spec


def _ids(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(type(x) is int for x in value):
        raise Wrong(key, f"must be a list of whole numbers, got {kind(value)}")
    return tuple(value)


def _logprobs(value: Any, key: str) -> tuple[float | None, ...]:
    if not isinstance(value, (list, tuple)):
        raise Wrong(key, f"must be a list of numbers (null where none), got {kind(value)}")
    out: list[float | None] = []
    for x in value:
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))):
            raise Wrong(key, f"must be a list of numbers (null where none), holds {kind(x)}")
        out.append(None if x is None else float(x))
    return tuple(out)


def _mask(value: Any, key: str) -> tuple[int, ...]:
    ids = _ids(value, key)
    if any(m not in (0, 1) for m in ids):
        raise Wrong(key, "must hold only 0 and 1")
    return ids


def _write(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in fields(obj)
            if not (f.metadata.get("optional") and getattr(obj, f.name) is None)}


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One rollout: what the trainer trains on (see the module's note for each key)."""

    prompt_ids: tuple[int, ...] = field(metadata=spec(_ids))
    completion_ids: tuple[int, ...] = field(metadata=spec(_ids))
    logprobs: tuple[float | None, ...] = field(metadata=spec(_logprobs))
    routed_experts: str | None = field(default=None, metadata=spec(TEXT, optional=True))
    completion_mask: tuple[int, ...] | None = field(default=None, metadata=spec(_mask, optional=True))
    reward: float = field(metadata=spec(number))
    advantage: float = field(metadata=spec(number))

    def __post_init__(self) -> None:
        if self.completion_mask is not None and len(self.completion_mask) != len(self.completion_ids):
            raise ValueError(f"completion_mask: {len(self.completion_mask)} entries for "
                             f"{len(self.completion_ids)} completion tokens")

    def mask(self) -> tuple[int, ...]:
        """1 at each completion token the model produced, 0 at the environment's (all 1 without a mask)."""
        return (1,) * len(self.completion_ids) if self.completion_mask is None else self.completion_mask

    def old_logprobs(self) -> list[float]:
        """The inference logprob at each completion token, NaN where there is none."""
        lp = [math.nan if v is None else v for v in self.logprobs[: len(self.completion_ids)]]
        return lp + [math.nan] * (len(self.completion_ids) - len(lp))

    def to_json(self) -> dict:
        return _write(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> Sample:
        """Raises ``Wrong`` (the kit's) naming the key under ``where``."""
        values = fields_of(cls, data, where)
        try:
            return cls(**values)
        except ValueError as e:  # the mask's length
            raise Wrong(where or TOP, str(e)) from None


@dataclass(frozen=True)
class RolloutBatch:
    """The batch of training step ``step``, generated with the weights of trainer step ``policy_step``."""

    step: int = field(metadata=spec(WHOLE))
    policy_step: int = field(metadata=spec(WHOLE))
    samples: tuple[Sample, ...] = field(metadata=spec(lambda v, key: _samples(v, key)))

    def to_json(self) -> dict:
        return {**_write(self), "samples": [s.to_json() for s in self.samples]}

    def dumps(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls, data: Any, source: str) -> RolloutBatch:
        """The batch in ``data`` (parsed JSON) read from ``source`` (the file, for the ``ContractError``)."""
        return parse(cls, data, source)

    @classmethod
    def loads(cls, text: str, source: str) -> RolloutBatch:
        """Raises json.JSONDecodeError for text that is not JSON (a file still being written elsewhere)."""
        return cls.from_json(json.loads(text), source)

    @classmethod
    def read(cls, path: Path) -> RolloutBatch:
        """The batch in the file at ``path`` (ContractError naming it; json.JSONDecodeError, OSError as they come)."""
        return cls.loads(Path(path).read_text(), str(path))


def _samples(value: Any, key: str) -> tuple[Sample, ...]:
    if not isinstance(value, (list, tuple)):
        raise Wrong(key, f"must be a list of samples, got {kind(value)}")
    return tuple(Sample.from_json(x, f"{key}[{i}]") for i, x in enumerate(value))

