"""Metric rows: one JSON object per line in ``RUN_DIR/metrics/<role>.jsonl`` (standard library only).

The orchestrator writes ``OrchestratorRow`` (``metrics/orchestrator.jsonl``) and ``EvalRow``
(``metrics/eval.jsonl``); the trainer writes ``TrainerRow`` (``metrics/trainer.jsonl``);
`slurmrl status`, `plot` and `report` read them back through the same classes. Every key is spelled
once, as a field name; a family of keys under one prefix is a typed group (``judge/...``: ``JudgeStats``,
``env/...``: ``EnvStats``) or a mapping (``trainer/...``: the trainer's newest row as the orchestrator
saw it; ``pass@K``: pass@k by k; ``served/URL``: rollouts by the URL that served them).

Writing (``to_json``) keeps the files as they always were: fields in the writer's order, a field
marked ``omit`` left out when None (``sleep_s`` of a run without the hybrid engine; every field of the
trainer's row), every other None
written as null, NaN and infinities as Python's json writes them. Reading (``from_json``) takes any row a
run ever wrote: a number field holds the number as written (NaN and infinities too) or None (absent,
null, not a number); a text field its text or None; keys no field names are kept in ``extra``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self

Number = int | float
JUDGE, ENV, TRAINER, PASS, SERVED = "judge/", "env/", "trainer/", "pass@", "served/"
_PASS_K = re.compile(r"^pass@([1-9][0-9]{0,5})$")


def number(value: Any) -> Number | None:
    """``value`` when it is a number (NaN and infinities too), else None (null, text, a boolean)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def finite(value: Any) -> float | None:
    """``value`` as a finite float; None when it is not a number, NaN or infinite."""
    v = number(value)
    try:
        return float(v) if v is not None and math.isfinite(v) else None
    except OverflowError:  # an integer too large for a float
        return None


def whole(value: Any) -> int | None:
    """``value`` as a whole number (a float that is one too), else None."""
    v = finite(value)
    return int(v) if v is not None and v == int(v) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _num(omit: bool = False) -> Any:
    return field(default=None, metadata={"read": number, "omit": omit})


def _str() -> Any:
    return field(default=None, metadata={"read": _text, "omit": False})


def _named(cls) -> list:
    return [f for f in fields(cls) if "read" in f.metadata]


def _flat(obj) -> dict:
    """``step`` (a row's) and the named fields in order (a None field marked ``omit`` left out)."""
    head = {"step": obj.step} if hasattr(obj, "step") else {}
    return {**head, **{f.name: getattr(obj, f.name) for f in _named(obj)
                       if not (f.metadata["omit"] and getattr(obj, f.name) is None)}}


def _fields_of(cls, data: dict) -> dict:
    return {f.name: f.metadata["read"](data.get(f.name)) for f in _named(cls)}


def _prefixed(data: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in data.items() if k.startswith(prefix)}


class _Family:
    """A typed group of keys under one prefix."""

    PREFIX: ClassVar[str]

    def to_json(self) -> dict:
        return {self.PREFIX + k: v for k, v in _flat(self).items()}

    @classmethod
    def from_json(cls, data: dict) -> Self | None:
        """The group's keys in a row; None when it has none."""
        own = _prefixed(data, cls.PREFIX)
        return cls(**_fields_of(cls, own)) if own else None


@dataclass(frozen=True)
class JudgeStats(_Family):
    """The judge's figures over a batch of scoring (``judge/...``): requests, samples scored, retries,
    replies without a score (a generative judge), latency mean and max in seconds."""

    PREFIX: ClassVar[str] = JUDGE
    requests: Number | None = _num()
    scored: Number | None = _num()
    retries: Number | None = _num()
    unparsed: Number | None = _num()
    latency_mean_s: Number | None = _num()
    latency_max_s: Number | None = _num()


@dataclass(frozen=True)
class EnvStats(_Family):
    """A chat environment's rollouts (``env/...``): turns per rollout, environment steps that raised or
    ran past their limit, rollouts a token limit ended, the environment's tokens."""

    PREFIX: ClassVar[str] = ENV
    turns_mean: Number | None = _num()
    errors: Number | None = _num()
    timeouts: Number | None = _num()
    cut: Number | None = _num()
    tokens: Number | None = _num()


def _groups(row: Any) -> dict:
    return {**(row.judge.to_json() if row.judge else {}), **(row.env.to_json() if row.env else {})}


def _extra(cls, data: dict, families: tuple[str, ...]) -> dict:
    names = {"step", *(f.name for f in _named(cls))}
    return {k: v for k, v in data.items() if k not in names and not k.startswith(families)}


@dataclass(frozen=True)
class OrchestratorRow:
    """One training batch (``metrics/orchestrator.jsonl``): its step, the policy that generated it and the
    lag, the rewards, the size, where its time went, the judge's and the environment's figures, the servers
    live when it was written, the requests sent again after a server failed, the rollouts each server (or the
    router) served (``served/URL``), and the trainer's newest row (``trainer/...``)."""

    step: int
    policy_step: Number | None = _num()
    off_policy_lag: Number | None = _num()
    reward_mean: Number | None = _num()
    reward_std: Number | None = _num()
    reward_min: Number | None = _num()
    reward_max: Number | None = _num()
    samples: Number | None = _num()
    tokens: Number | None = _num()
    generate_s: Number | None = _num()
    wait_s: Number | None = _num()
    tokens_per_s: Number | None = _num()
    samples_per_s: Number | None = _num()
    reload_s: Number | None = _num()
    sleep_s: Number | None = _num(omit=True)
    score_s: Number | None = _num()
    servers_live: Number | None = _num(omit=True)
    resent: Number | None = _num(omit=True)
    judge: JudgeStats | None = None
    env: EnvStats | None = None
    time: Number | None = _num()
    served: dict[str, Number | None] = field(default_factory=dict)
    trainer: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        flat = _flat(self)
        head = {k: v for k, v in flat.items() if k != "time"}
        return {**head, **_groups(self), **{SERVED + k: v for k, v in self.served.items()}, "time": self.time,
                **{TRAINER + k: v for k, v in self.trainer.items()}, **self.extra}

    @classmethod
    def from_json(cls, data: dict, step: int) -> OrchestratorRow:
        return cls(step=step, **{k: v for k, v in _fields_of(cls, data).items() if k != "step"},
                   judge=JudgeStats.from_json(data), env=EnvStats.from_json(data),
                   served={k: number(v) for k, v in _prefixed(data, SERVED).items()},
                   trainer=_prefixed(data, TRAINER), extra=_extra(cls, data, (JUDGE, ENV, TRAINER, SERVED)))


@dataclass(frozen=True)
class TrainerRow:
    """One optimizer step (``metrics/trainer.jsonl``). SFT rows carry ``epoch``; RL rows the KL, entropy,
    clip and reward figures and the policy the batch came from; CUDA memory fields on a GPU only. The
    trainer writes it through ``to_json``, which leaves out every field its step did not measure (None)."""

    step: int
    kind: str | None = _str()
    loss: Number | None = _num(omit=True)
    kl: Number | None = _num(omit=True)
    kl_max: Number | None = _num(omit=True)
    kl_inference: Number | None = _num(omit=True)
    kl_inference_max: Number | None = _num(omit=True)
    entropy: Number | None = _num(omit=True)
    clip_frac: Number | None = _num(omit=True)
    masked_frac: Number | None = _num(omit=True)
    ratio_mean: Number | None = _num(omit=True)
    tokens: Number | None = _num(omit=True)
    target_tokens: Number | None = _num(omit=True)
    epoch: Number | None = _num(omit=True)
    samples: Number | None = _num(omit=True)
    reward_mean: Number | None = _num(omit=True)
    reward_std: Number | None = _num(omit=True)
    reward_min: Number | None = _num(omit=True)
    reward_max: Number | None = _num(omit=True)
    policy_step: Number | None = _num(omit=True)
    cpu_rss_gib: Number | None = _num(omit=True)
    cpu_rss_peak_gib: Number | None = _num(omit=True)
    cuda_mem_allocated_gib: Number | None = _num(omit=True)
    cuda_mem_reserved_gib: Number | None = _num(omit=True)
    cuda_mem_peak_gib: Number | None = _num(omit=True)
    model_tflops_per_device: Number | None = _num(omit=True)
    mfu: Number | None = _num(omit=True)
    grad_norm: Number | None = _num(omit=True)
    lr: Number | None = _num(omit=True)
    tokens_per_s: Number | None = _num(omit=True)
    step_time_s: Number | None = _num(omit=True)
    wait_s: Number | None = _num(omit=True)
    publish_s: Number | None = _num(omit=True)
    sync_s: Number | None = _num(omit=True)
    sync_background_s: Number | None = _num(omit=True)  # seconds the previous step's publish ran beside this one
    sync_share: Number | None = _num(omit=True)
    time: Number | None = _num(omit=True)
    off_policy_lag: Number | None = _num(omit=True)
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**_flat(self), **self.extra}

    @classmethod
    def from_json(cls, data: dict, step: int) -> TrainerRow:
        return cls(step=step, **{k: v for k, v in _fields_of(cls, data).items() if k != "step"},
                   extra=_extra(cls, data, ()))


@dataclass(frozen=True)
class EvalRow:
    """One evaluation (``metrics/eval.jsonl``): ``step`` is the trainer step whose weights were evaluated
    (0: the model before training); the prompts and how they were sampled, the rewards and pass@k by k,
    the environment's figures (a chat environment), the time taken, the judge's figures."""

    step: int
    environment: str | None = _str()
    split: str | None = _str()
    prompts: Number | None = _num()
    samples_per_prompt: Number | None = _num()
    temperature: Number | None = _num()
    reward_mean: Number | None = _num()
    reward_std: Number | None = _num()
    pass_at: dict[int, Number | None] = field(default_factory=dict)
    completion_chars_mean: Number | None = _num()
    env: EnvStats | None = None
    generate_s: Number | None = _num()
    eval_s: Number | None = _num()
    judge: JudgeStats | None = None
    time: Number | None = _num()
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        flat = _flat(self)
        order = list(flat)
        cut = order.index("completion_chars_mean")
        head, mid = order[:cut], order[cut:order.index("generate_s")]
        return {**{k: flat[k] for k in head}, **{f"{PASS}{k}": v for k, v in self.pass_at.items()},
                **{k: flat[k] for k in mid}, **(self.env.to_json() if self.env else {}),
                "generate_s": self.generate_s, "eval_s": self.eval_s, **(self.judge.to_json() if self.judge else {}),
                "time": self.time, **self.extra}

    @classmethod
    def from_json(cls, data: dict, step: int) -> EvalRow:
        pass_at = {int(m.group(1)): number(v) for k, v in data.items() if (m := _PASS_K.match(k))}
        return cls(step=step, **{k: v for k, v in _fields_of(cls, data).items() if k != "step"},
                   pass_at=dict(sorted(pass_at.items())), judge=JudgeStats.from_json(data),
                   env=EnvStats.from_json(data), extra=_extra(cls, data, (JUDGE, ENV, PASS)))

