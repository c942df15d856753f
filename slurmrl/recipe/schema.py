"""The recipe: what the user wants, as pydantic models.

Unknown keys are errors (``extra="forbid"``). Every field carries a description;
``docs/recipe-reference.md`` is generated from them (``python -m slurmrl.recipe.reference``)
and a test fails when a field is missing there. Cross-field topology rules live in the
planner, not here: this module only checks what one field can check on its own.

The fields the trainer and orchestrator programs read (``TrainerKnobs``, ``OrchestratorKnobs``)
are also the base of their typed settings (``slurmrl.settings``): each default is written once.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Environment variables the launcher sets itself; a recipe may not override them.
PROTECTED_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
        "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "VLLM_PORT", "VLLM_HOST_IP",
        "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_NIXL_SIDE_CHANNEL_HOST",
    }
)
PROTECTED_ENV_PREFIXES = ("SLURM_", "SLURMRL_", "PMI_", "PMIX_")
SECRET_ENV = re.compile(r"(^|_)(API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)($|_)", re.I)  # never into the script

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]


def _check_env(env: dict[str, str]) -> dict[str, str]:
    for key in env:
        if not ENV_NAME_RE.match(key):
            raise ValueError(f"{key!r} is not a valid environment variable name")
        if key in PROTECTED_ENV or key.startswith(PROTECTED_ENV_PREFIXES):
            raise ValueError(f"{key} is set by the slurmrl launcher and cannot be overridden")
        if SECRET_ENV.search(key):
            raise ValueError(
                f"{key} looks like a secret; it would be written into job.sbatch. Export it in the shell you "
                "submit from (sbatch passes your environment to the job), or list it in container.env"
            )
    return env


def _check_single_line(values: list[str], what: str) -> list[str]:
    for v in values:
        if "\n" in v or "\r" in v:
            raise ValueError(f"{what} must be single lines; got {v!r}")
    return values


class Section(BaseModel):
    # coerce_numbers_to_str: `--set slurm.time=90` or `account = 1234` mean the text.
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


EnvMap = Annotated[dict[str, str], AfterValidator(_check_env)]


class Slurm(Section):
    """Directives for sbatch. Every het group gets the same account/partition/qos/time."""

    job_name: str | None = Field(None, description="Slurm job name; defaults to the recipe name.")
    account: str | None = Field(None, description="`--account` to charge.")
    partition: str | None = Field(None, description="`--partition` for the GPU groups.")
    cpu_partition: str | None = Field(
        None, description="`--partition` for a CPU-only group (own orchestrator); defaults to `partition`."
    )
    qos: str | None = Field(None, description="`--qos`.")
    time: str = Field("01:00:00", description="Wall-clock limit, `[D-]HH:MM:SS` or minutes.")
    nodelist: str | None = Field(None, description="`--nodelist` (applies to the first het group).")
    exclude: str | None = Field(None, description="`--exclude` nodes, for every group.")
    constraint: str | None = Field(None, description="`--constraint` feature expression, for GPU groups.")
    exclusive: bool = Field(False, description="Ask for whole nodes (`--exclusive`).")
    mem: str | None = Field(None, description="`--mem` per node, e.g. `0` (all) or `200G`.")
    cpus_per_node: PosInt = Field(16, description="CPUs to request per node; split between the node's components.")
    gpus_per_node: NonNegInt = Field(8, description="GPUs on each GPU node.")
    gpu_request: Literal["gpus-per-node", "gres"] = Field(
        "gpus-per-node", description="Ask for GPUs with `--gpus-per-node=N` or `--gres=gpu:N`."
    )
    gpu_type: str | None = Field(None, description="GPU type for the request, e.g. `h100` (`gpu:h100:8`).")
    dependency: str | None = Field(None, description="`--dependency`, e.g. `afterok:1234`.")
    requeue: bool = Field(True, description="Requeue the job on preemption or on the warning signal.")
    signal: str = Field(
        "USR1@120",
        description="Warning signal and seconds before the time limit (`SIG@SECONDS`); "
        "the script traps it, asks trainer and orchestrator to checkpoint, then requeues.",
    )
    max_requeues: NonNegInt = Field(
        3, le=1000,
        description="How many times the warning signal may requeue the job (0-1000). A warning that comes before "
        "every component is ready never requeues: the next attempt would start over the same way.",
    )
    max_total_time: str | None = Field(
        None, description="Total wall-clock budget over all attempts (Slurm time format); no requeue once it is used."
    )
    grace_seconds: NonNegInt = Field(
        60, description="After a failure or the warning signal: seconds components get to flush before KILL."
    )
    mail_user: str | None = Field(None, description="`--mail-user`.")
    mail_type: str | None = Field(None, description="`--mail-type`, e.g. `END,FAIL`.")
    comment: str | None = Field(None, description="`--comment`.")
    extra_directives: list[str] = Field(
        default_factory=list,
        description="Any other `#SBATCH` options, verbatim, e.g. `--reservation=big` (first het group).",
    )

    @field_validator("*")
    @classmethod
    def _directive_text(cls, v):
        """#SBATCH lines are read by sbatch, not bash: no line breaks or double quotes there."""
        for item in v if isinstance(v, list) else [v]:
            if isinstance(item, str) and any(c in item for c in '"\n\r'):
                raise ValueError(f"{item!r} cannot hold line breaks or double quotes (it goes on an #SBATCH line)")
        return v

    @field_validator("time", "max_total_time")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$", v):
            raise ValueError(f"{v!r} is not a Slurm time; use HH:MM:SS, D-HH:MM:SS or minutes")
        return v

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        if not re.match(r"^(SIG)?[A-Z0-9]+@\d+$", v):
            raise ValueError(f"{v!r} is not SIGNAL@SECONDS, e.g. USR1@120")
        return v.removeprefix("SIG")

    @field_validator("extra_directives")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        _check_single_line(v, "extra directives")
        for d in v:
            if not d.startswith("-"):
                raise ValueError(f"{d!r} must be an sbatch option starting with '-'")
        return v

    @field_validator("mem")
    @classmethod
    def _mem(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^\d+[KMGT]?$", v):
            raise ValueError(f"{v!r} is not a memory size like 0, 500G or 64000M")
        return v


class Container(Section):
    """Pyxis container for every step. The run dir is mounted automatically."""

    image: str = Field(description="Image for `--container-image` (squashfs path or registry#image).")
    mounts: list[str] = Field(default_factory=list, description="`SRC:DST[:FLAGS]` for `--container-mounts`.")
    workdir: str | None = Field(None, description="`--container-workdir`.")
    env: list[str] = Field(default_factory=list, description="Names of host variables to pass (`--container-env`).")
    remap_root: bool | None = Field(None, description="`--container-remap-root` / `--no-container-remap-root`.")
    mount_home: bool | None = Field(None, description="`--container-mount-home` / `--no-container-mount-home`.")
    writable: bool | None = Field(None, description="`--container-writable` (true) or `--container-readonly`.")
    entrypoint: bool | None = Field(None, description="`--container-entrypoint` / `--no-container-entrypoint`.")
    name: str | None = Field(None, description="`--container-name`, to reuse the unpacked image between steps.")

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            parts = m.split(":")
            if len(parts) not in (2, 3) or not all(parts[:2]) or "," in m:
                raise ValueError(f"{m!r} is not SRC:DST or SRC:DST:FLAGS (no commas)")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: list[str]) -> list[str]:
        for name in v:
            if not ENV_NAME_RE.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return v


class Python(Section):
    """How to enter the Python environment when there is no container (or inside it)."""

    venv: str | None = Field(None, description="Virtualenv to activate (`source VENV/bin/activate`).")
    uv_project: str | None = Field(None, description="Run Python through `uv run --project DIR`.")
    modules: list[str] = Field(default_factory=list, description="Environment modules to `module load`.")
    setup: list[str] = Field(
        default_factory=list, description="Shell lines run verbatim in the batch shell before anything starts."
    )
    executable: str = Field("python3", description="Python interpreter name or path.")

    @field_validator("setup")
    @classmethod
    def _setup(cls, v: list[str]) -> list[str]:
        return _check_single_line(v, "setup lines")


class Model(Section):
    path: str = Field(description="Hugging Face id or a directory with the model.")
    served_name: str | None = Field(None, description="Name the OpenAI API serves; defaults to `path`.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="Weights dtype.")
    max_model_len: PosInt | None = Field(None, description="Context length for inference.")
    trust_remote_code: bool = Field(False, description="Allow model code from the checkpoint.")

    @property
    def served_model_name(self) -> str:
        """The name the OpenAI API serves (``served_name``, else ``path``)."""
        return self.served_name or self.path


class TrainerKnobs(Section):
    """The trainer fields its program reads. ``slurmrl.settings.trainer.TrainerSettings`` extends
    this with what the planner derives, so a default lives here and nowhere else."""

    dataset: str | None = Field(None, description="SFT: JSONL file (prompt/completion or chat messages).")
    lr: float = Field(1e-5, gt=0, description="Learning rate.")
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Clip the global gradient norm to this before each step.")
    micro_batch_size: PosInt = Field(4, description="Sequences per forward/backward per GPU.")
    seq_len: PosInt = Field(2048, description="Maximum tokens per sequence (packing length for SFT).")
    max_steps: PosInt = Field(100, description="Optimizer steps to run.")
    checkpoint_every: PosInt = Field(10, description="Steps between checkpoints.")
    keep_checkpoints: PosInt = Field(3, description="Checkpoints to keep.")
    gradient_checkpointing: bool = Field(True, description="Recompute activations in backward.")
    dtype: Literal["bfloat16", "float32"] = Field("bfloat16", description="Training dtype (fp32 where no bf16).")
    clip_eps: float = Field(0.2, gt=0, description="RL: importance-ratio clip range.")
    kl_coef: float = Field(0.0, ge=0, description="RL: KL penalty to the reference model (0 = off).")
    seed: int = Field(0, description="Random seed.")


SFT_BATCH_SIZE = 32  # trainer.batch_size of kind sft when the recipe leaves it out; see global_batch()


class Trainer(TrainerKnobs):
    nodes: PosInt = Field(1, description="Trainer nodes.")
    gpus_per_node: NonNegInt | None = Field(
        None, description="GPUs per node for the trainer; defaults to all (or what inference leaves when colocated)."
    )
    batch_size: PosInt | None = Field(
        None,
        description=f"Sequences per optimizer step (global). Kind `sft`: {SFT_BATCH_SIZE} when left out. "
        "Kind `rl`: always orchestrator.prompts_per_step x rollouts_per_prompt; leave it out or give that number.",
    )
    weight_sync: Literal["filesystem", "nccl"] = Field(
        "filesystem",
        description="RL: how new weights reach inference: safetensors in the run dir. `nccl` (broadcast) "
        "is refused by `plan` until the trainer implements it.",
    )
    env: EnvMap = Field(default_factory=dict, description="Extra environment for the trainer step.")


class OrchestratorKnobs(Section):
    """The orchestrator fields its program reads. ``slurmrl.settings.orchestrator.OrchestratorSettings``
    extends this with what the planner derives, so a default lives here and nowhere else."""

    environment: str = Field(
        "reverse_text", description="Built-in environment name or `package.module:Class` for a custom one."
    )
    environment_args: dict[str, bool | int | float | str] = Field(
        default_factory=dict,
        description="Keyword arguments for the environment's constructor, e.g. `{ few_shot = 2 }` for "
        "`arithmetic` (built-in environments' arguments are checked by `plan`).",
    )
    prompts_per_step: PosInt = Field(8, description="Prompts sampled per training step.")
    rollouts_per_prompt: PosInt = Field(8, description="Completions per prompt (the GRPO group size).")
    max_tokens: PosInt = Field(128, description="Maximum new tokens per completion.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature.")
    max_off_policy_steps: NonNegInt = Field(
        1, description="How many steps generation may run ahead of training (0 = synchronous)."
    )
    seed: int = Field(0, description="Random seed.")


class Orchestrator(OrchestratorKnobs):
    placement: Literal["trainer", "inference", "own"] = Field(
        "trainer",
        description="Where the one orchestrator runs: the trainer's head node, the first inference node, "
        "or its own CPU-only het group.",
    )
    cpus: PosInt = Field(2, description="CPUs for the orchestrator.")
    env: EnvMap = Field(default_factory=dict, description="Extra environment for the orchestrator step.")


class Router(Section):
    enabled: bool | None = Field(
        None, description="Run vllm-router on the first inference node; default: when there is more than one server."
    )
    policy: Literal["consistent_hash", "round_robin"] = Field(
        "consistent_hash", description="Routing policy; `consistent_hash` keys on `session_header`."
    )
    session_header: Literal[
        "X-Session-ID", "X-User-ID", "X-Tenant-ID", "X-Request-ID", "X-Correlation-ID", "X-Trace-ID"
    ] = Field(
        "X-Session-ID",
        description="Header clients send to key consistent hashing (the headers vllm-router reads, "
        "in its priority order).",
    )
    extra_args: list[str] = Field(default_factory=list, description="Extra `vllm-router` arguments.")


class KVOffload(Section):
    kind: Literal["none", "cpu", "cpu_disk", "mooncake"] = Field(
        "none", description="KV-cache offload: vLLM native to CPU, CPU then disk, or a Mooncake store."
    )
    cpu_gb: float = Field(0, ge=0, description="CPU memory per inference node for offloaded KV (GB).")
    disk_path: str | None = Field(None, description="`cpu_disk` / `mooncake`: local disk folder for KV.")
    disk_gb: float = Field(0, ge=0, description="Disk budget per node (GB).")
    mooncake_protocol: Literal["tcp", "rdma"] = Field("rdma", description="Mooncake transfer protocol.")
    mooncake_device: str | None = Field(None, description="RDMA device names for Mooncake, e.g. `mlx5_0`.")


class PDRole(Section):
    """One side of prefill/decode disaggregation."""

    replicas: PosInt = Field(1, description="vLLM servers of this role.")
    tp: PosInt = Field(1, description="Tensor-parallel size per server.")
    nodes: PosInt | None = Field(None, description="Nodes for this role; default: as few as fit the replicas.")
    extra_args: list[str] = Field(default_factory=list, description="Extra `vllm serve` arguments for this role.")
    env: EnvMap = Field(default_factory=dict, description="Extra environment for this role.")


class Inference(Section):
    mode: Literal["replicas", "wide_ep", "pd"] = Field(
        "replicas",
        description="`replicas`: independent servers; `wide_ep`: one data-parallel deployment across nodes; "
        "`pd`: prefill/decode disaggregation.",
    )
    nodes: PosInt = Field(1, description="Inference nodes (`replicas`, `wide_ep`).")
    gpus_per_node: NonNegInt | None = Field(
        None, description="GPUs per node for inference; defaults to all (required when colocated)."
    )
    tp: PosInt = Field(1, description="Tensor-parallel size.")
    dp: PosInt = Field(
        1,
        description="`replicas`: vLLM data-parallel ranks inside one server; `wide_ep`: the total DP size across nodes.",
    )
    expert_parallel: bool | None = Field(
        None, description="`--enable-expert-parallel`; default on for `wide_ep`, off otherwise."
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Fraction of GPU memory for vLLM (set for you when sharing a GPU)."
    )
    enforce_eager: bool = Field(False, description="Disable CUDA graphs / torch.compile.")
    auth: Literal["job_secret", "none"] = Field(
        "job_secret",
        description="`job_secret`: every request to the servers (and through the router) needs `Authorization: "
        "Bearer` with the run dir's `secret`, admin endpoints included (`/health` and `/metrics` stay open); "
        "`none`: anyone who reaches the ports may call them.",
    )
    admin_endpoints: bool | None = Field(
        None,
        description="Expose vLLM's pause / reload_weights / resume endpoints (VLLM_SERVER_DEV_MODE) for live "
        "weight updates; default on for kind `rl`, off otherwise.",
    )
    max_lora_rank: PosInt | None = Field(
        None, description="Enable LoRA adapters loaded at run time (`slurmrl.runtime.admin lora-load`) up to this rank."
    )
    kv_connector: Literal["NixlConnector", "P2pNcclConnector"] = Field(
        "NixlConnector", description="P/D: KV transfer connector."
    )
    prefill: PDRole | None = Field(None, description="P/D: the prefill role.")
    decode: PDRole | None = Field(None, description="P/D: the decode role.")
    router: Router = Field(default_factory=Router, description="vllm-router in front of the servers.")
    kv_offload: KVOffload = Field(default_factory=KVOffload, description="KV-cache offload.")
    extra_args: list[str] = Field(default_factory=list, description="Extra `vllm serve` arguments.")
    env: EnvMap = Field(default_factory=dict, description="Extra environment for the inference steps.")
    startup_timeout: PosInt = Field(1800, description="Seconds to wait for servers to answer /health.")


class Placement(Section):
    colocate: bool = Field(
        False, description="RL on one node: trainer and inference share the node, GPUs split between them."
    )
    share_gpus: bool = Field(
        False, description="Trainer and inference use the same GPUs (e.g. one GPU); needs `colocate`."
    )
    port_base: Annotated[int, Field(ge=1024, le=65000)] | None = Field(
        None, description="Fixed first port instead of one derived from the job id (debugging only)."
    )


class Recipe(Section):
    name: str = Field(pattern=NAME_RE, description="Run name; also the run dir name.")
    kind: Literal["sft", "rl", "inference"] = Field(description="What the job does.")
    output_dir: str = Field("runs", description="Parent folder of run dirs (relative to the current directory).")
    templates_dir: str | None = Field(
        None,
        description="Folder of ejected templates (`slurmrl templates eject`) to render with instead "
        "(relative to the recipe file).",
    )
    slurm: Slurm = Field(default_factory=Slurm, description="sbatch directives.")
    container: Container | None = Field(None, description="Pyxis container; omit to run on the host.")
    python: Python = Field(default_factory=Python, description="Python environment on the host.")
    model: Model = Field(description="The model.")
    env: EnvMap = Field(default_factory=dict, description="Environment for every step.")
    placement: Placement = Field(default_factory=Placement, description="Placement choices.")
    trainer: Trainer | None = Field(None, description="Trainer (kinds `sft`, `rl`).")
    orchestrator: Orchestrator | None = Field(None, description="Orchestrator (kind `rl`).")
    inference: Inference | None = Field(None, description="Inference servers (kinds `rl`, `inference`).")


def time_seconds(text: str) -> int:
    """Seconds in a Slurm time: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    days, _, rest = text.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:
        h, m, sec = (parts + [0, 0])[:3]
    else:
        h, m, sec = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


def global_batch(r: Recipe) -> int:
    """Sequences per optimizer step, the one place ``trainer.batch_size`` is resolved: kind ``rl``
    samples prompts_per_step x rollouts_per_prompt (a recipe's batch_size must agree, see
    ``slurmrl.plan.rules``); kind ``sft`` takes batch_size, or ``SFT_BATCH_SIZE``."""
    if r.kind == "rl":
        o = r.orchestrator or Orchestrator()
        return o.prompts_per_step * o.rollouts_per_prompt
    return r.trainer.batch_size or SFT_BATCH_SIZE
