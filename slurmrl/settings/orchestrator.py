"""The orchestrator's settings: ``RUN_DIR/components/orchestrator.toml``, read by
``slurmrl.runtime.orchestrator``. Where requests and weight reloads go is not here: the job
script passes those URLs on the command line (``--requests-url``, ``--admin-urls``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from slurmrl.contract.weight_sync import Filesystem
from slurmrl.settings.eval import EvalSettings
from slurmrl.settings.judge import JudgeSettings
from slurmrl.settings.limits import INT64, MAX_SEED, MAX_TOKENS
from slurmrl.settings.read import read
from slurmrl.settings.section import PosInt, Section, WeightSyncValue
from slurmrl.settings.wandb import WandbSettings


class OrchestratorKnobs(Section):
    """The orchestrator fields its program reads. ``slurmrl.settings.orchestrator.OrchestratorSettings``
    extends this with what the planner derives, so a default lives here and nowhere else."""

    environment: str = Field(
        "reverse_text", description="Built-in environment name, `package.module:Class` for a custom one, or "
        "`verifiers:ENV_ID` for an installed verifiers 0.1.x environment (the `verifiers` extra), "
        "`verifiers-v1:TASKSET_ID` for a verifiers v1 taskset (verifiers 0.4, in .venv-verifiers)."
    )
    environment_args: dict[str, bool | Annotated[int, Field(ge=INT64[0], le=INT64[1])] | float | str] = Field(
        default_factory=dict,
        description="Keyword arguments for the environment's constructor (for `verifiers:ENV_ID`: its "
        "`load_environment`; for `verifiers-v1:TASKSET_ID`: its taskset config), e.g. `{ few_shot = 2 }` for `arithmetic` (built-in environments' arguments are "
        "checked by `plan`).",
    )
    prompts_per_step: int = Field(8, ge=1, le=65536, description="Prompts sampled per training step (1-65536).")
    rollouts_per_prompt: int = Field(
        8, ge=1, le=4096, description="Completions per prompt (the GRPO group size; 1-4096)."
    )
    max_tokens: int = Field(
        128, ge=1, le=MAX_TOKENS, description=f"Maximum new tokens per completion (1-{MAX_TOKENS})."
    )
    temperature: float = Field(
        1.0, ge=0, le=10, description="Sampling temperature (0-10; vLLM sets no cap, text is noise well before 10)."
    )
    max_off_policy_steps: int = Field(
        1, ge=0, le=1000, description="How many steps generation may run ahead of training (0 = synchronous; 0-1000)."
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description=f"Random seed (0-{MAX_SEED}).")
    max_turns: int = Field(
        8, ge=1, le=1000, description="A chat environment's conversation: model turns at most (1-1000); "
        "`max_tokens` is then each turn's limit.",
    )
    max_rollout_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = Field(
        None, description=f"A chat environment's conversation: tokens after the prompt at most, the model's and "
        f"the environment's together (1-{MAX_TOKENS}; unset: no limit beyond `max_turns` x `max_tokens` of the "
        f"model's own; `trainer.seq_len` cuts what is longer).",
    )
    advantage: Literal["group_std", "group_mean"] = Field(
        "group_std", description="RL advantage of a rollout: `group_std`, its reward minus its group's mean reward, "
        "over the group's standard deviation (GRPO); `group_mean`, not divided (Dr. GRPO: groups whose rewards "
        "barely differ do not get large advantages).",
    )
    env_timeout_s: float = Field(
        30.0, gt=0, le=86400, description="Seconds one environment step (a rollout's start, its answer to a turn, a "
        "tool call, the reward) may take (above 0, at most 86400 s); one that takes longer or raises scores its rollout 0 and is counted "
        "in the metrics (`env/timeouts`, `env/errors`).",
    )




class OrchestratorSettings(OrchestratorKnobs):
    """The recipe's orchestrator fields the program reads (defaults there), plus what the planner derives."""

    run_dir: str = Field(description="The run dir (absolute).")
    model: str = Field(description="Where the tokenizer comes from: recipe model.path (hub id or folder).")
    served_model_name: str = Field(description="The model name the inference servers answer to.")
    trust_remote_code: bool = Field(False, description="Allow tokenizer code from the checkpoint: model.trust_remote_code.")
    max_steps: PosInt = Field(description="Batches to produce: trainer.max_steps.")
    judge: JudgeSettings | None = Field(
        None, description="How rewards are scored through the job's judge ([judge]); None without one."
    )
    weight_sync: WeightSyncValue = Field(
        default_factory=Filesystem, description="trainer.weight_sync as the planner decided it "
        "(slurmrl.contract.weight_sync): filesystem (the servers reload each published step), or a broadcast "
        "(the trainer sends the weights itself and marks the step; generation waits for it).",
    )
    hybrid: bool = Field(
        False, description="placement.colocate = 'hybrid': put the servers to sleep before each batch is handed "
        "to the trainer, wake them and reload the new weights before the next (slurmrl.runtime.orchestrator.hybrid).",
    )
    lora: bool = Field(
        False, description="[trainer.lora]: the trainer publishes each step's adapter, which every server hot-loads "
        "under a new name (slurmrl.runtime.orchestrator.adapters).",
    )
    min_servers: PosInt = Field(
        1, description="inference.min_servers: the orchestrator fails when fewer servers are live for longer than "
        "`servers_grace_s` (slurmrl.runtime.orchestrator.members).",
    )
    servers_grace_s: float = Field(
        1800.0, gt=0, le=86400, description="inference.startup_timeout: how long fewer than `min_servers` may be live "
        "(the time a restarted server may take to come back) before the orchestrator fails.",
    )
    eval: EvalSettings | None = Field(None, description="Evaluation during training ([eval]); None without it.")
    chat_only_set: list[str] = Field(
        default_factory=list, description="The chat-only recipe fields the recipe sets to other values than their "
        "defaults (slurmrl.envs.protocol.CHAT_ONLY): refused by the preflight and at start when no environment of "
        "the job is a chat environment (the planner refuses them, whatever their value, for a built-in one).",
    )
    wandb: WandbSettings = Field(default_factory=WandbSettings, description="Its W&B run ([wandb]).")

    @property
    def root(self) -> Path:
        return Path(self.run_dir)


def load(path: str | Path) -> OrchestratorSettings:
    return read(OrchestratorSettings, path)
