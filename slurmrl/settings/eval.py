"""Evaluation during training: the ``eval`` table of ``RUN_DIR/components/orchestrator.toml``, read by
``slurmrl.runtime.orchestrator.evaluate``. The recipe's ``[eval]`` (``slurmrl.recipe.eval``) extends
``EvalKnobs``; ``EvalSettings`` adds what the planner resolves (the environment, max_tokens)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from slurmrl.errors import UserError
from slurmrl.settings.limits import INT64, MAX_SEED, MAX_STEPS, MAX_TOKENS
from slurmrl.settings.section import Section

EnvArgs = dict[str, bool | Annotated[int, Field(ge=INT64[0], le=INT64[1])] | float | str]


class EvalKnobs(Section):
    """The [eval] fields the orchestrator's evaluation reads; ``EvalSettings`` extends this."""

    every: int = Field(
        description=f"Evaluate the policy every this many trainer steps (on the weights of steps every, 2 x every, "
        f"...; 1-{MAX_STEPS}). Rows go to RUN_DIR/metrics/eval.jsonl.",
        ge=1, le=MAX_STEPS,
    )
    at_start: bool = Field(True, description="Also evaluate the model before training (row of step 0).")
    environment: str | None = Field(
        None,
        description="Evaluate on this environment (built-in name or `package.module:Class`) instead of the held-out "
        "split of orchestrator.environment.",
    )
    environment_args: EnvArgs = Field(
        default_factory=dict, description="Keyword arguments for eval.environment's constructor (only with it).",
    )
    heldout_fraction: float = Field(
        0.1, gt=0, le=0.5,
        description="Without eval.environment: the share of orchestrator.environment's tasks (chosen by a hash of "
        "each task, the same in every run) kept out of training and evaluated on (above 0, at most 0.5).",
    )
    prompts: int = Field(
        32, ge=1, le=65536,
        description="Prompts per evaluation, the same ones each time (1-65536; fewer when the held-out split has "
        "fewer distinct tasks).",
    )
    samples_per_prompt: int = Field(
        1, ge=1, le=1024, description="Completions per prompt (conversations, in a chat environment): pass@k is "
        "reported for k = 1, 2, 4, ... up to this (1-1024).",
    )
    temperature: float = Field(
        0.0, ge=0, le=10, description="Sampling temperature of evaluation (0 = greedy; 0-10).",
    )
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = Field(
        None, description=f"Maximum new tokens per completion, per model turn in a chat environment (1-{MAX_TOKENS}); "
        "default orchestrator.max_tokens.",
    )
    correct_at: float = Field(
        1.0, ge=-1e6, le=1e6,
        description="A completion counts as correct for pass@k when its reward is at least this (-1000000-1000000).",
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description=f"Seed of the evaluation prompts and sampling (0-{MAX_SEED}).")

    @model_validator(mode="after")
    def _consistent(self):
        if self.samples_per_prompt > 1 and self.temperature == 0:
            raise UserError("eval.samples_per_prompt", "greedy sampling (eval.temperature = 0) gives the same "
                            "completion every time; set eval.temperature above 0 for pass@k, or 1 sample")
        if "environment_args" in self.model_fields_set and self.environment is None:  # `{}` too: no effect
            raise UserError("eval.environment_args", "only applies with eval.environment (the held-out split uses "
                            "orchestrator.environment with orchestrator.environment_args)")
        if self.environment is not None and "heldout_fraction" in self.model_fields_set:
            raise UserError("eval.heldout_fraction", "only applies to the held-out split of orchestrator.environment; "
                            "eval.environment is evaluated on its own prompts")
        return self


class EvalSettings(EvalKnobs):
    """The recipe's [eval] (defaults there), with the environment and max_tokens resolved."""

    environment: str = Field(description="eval.environment, or orchestrator.environment.")
    environment_args: EnvArgs = Field(default_factory=dict, description="Its constructor's arguments.")
    heldout: bool = Field(description="True: evaluate on the held-out split of the training environment, which "
                          "training then never samples.")
    max_tokens: int = Field(ge=1, le=MAX_TOKENS, description="eval.max_tokens, or orchestrator.max_tokens.")

    @model_validator(mode="after")
    def _consistent(self):  # the recipe's rules were checked on the recipe; these are resolved values
        return self
