"""The recipe: what the user wants, as pydantic models.

Unknown keys are errors (``extra="forbid"``). Every field carries a description;
``docs/recipe-reference.md`` is generated from them (``python -m slurmrl.recipe.reference``)
and a test fails when a field is missing there. Cross-field topology rules live in the
planner, not here: this module only checks what one field can check on its own, plus one
whole-job size cap (``job_gpus``) so that no plan grows with an absurd number.

Every number has a range, stated in its field's description (a test checks the two agree) and
chosen from what Slurm, vLLM and the largest clusters really allow (see the ``MAX_*`` constants).
Non-finite floats (``inf``, ``nan``, ``1e999``) are refused by every section.

The fields the trainer and orchestrator programs read (``TrainerKnobs``, ``OrchestratorKnobs``)
are also the base of their typed settings (``slurmrl.settings``): each default is written once.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from slurmrl.errors import UserError

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

# Ranges (each field's description states its own; docs/recipe-reference.md shows them).
MAX_NODES = 16384  # nodes in one group: the largest Slurm GPU systems have about 10k nodes (Frontier: 9,408)
MAX_GPUS_PER_NODE = 64  # 8 is usual; 8 MI300X in CPX mode show 64, 8 H100 with 7 MIG slices 56
MAX_JOB_GPUS = 131072  # GPUs in one job, every group together: the largest clusters hold about 100k
MAX_CPUS = 4096  # CPUs per node: the largest nodes have 2 x 192 cores x 2 threads = 768
MAX_TOKENS = 2**24  # context and sequence lengths: 16,777,216 tokens (the longest contexts today: 10M)
MAX_STEPS = 10**9  # optimizer steps: 31 years at one step per second
MAX_SEED = 2**32 - 1  # numpy's seed range; the orchestrator derives per-request seeds from it
MAX_SIGNAL_SECONDS = 65535  # sbatch --signal: "sig_time must have an integer value between 0 and 65535"
MAX_DAYS = 365  # slurm.time: partitions' MaxTime is hours to weeks
MAX_MEM_MB = 64 * 2**20  # slurm.mem: 64T per node (the largest nodes have 32T)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's MaxLoRARanks
INT64 = (-(2**63), 2**63 - 1)  # TOML integers are 64-bit


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
    # allow_inf_nan=False: `lr = inf`, `nan` or `1e999` (infinite in a float) are refused.
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True, allow_inf_nan=False)


EnvMap = Annotated[dict[str, str], AfterValidator(_check_env)]

VLLM_ARG_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# vLLM arguments slurmrl writes itself, and the recipe field that sets each
VLLM_OWNED = {
    "model": "model.path", "served_model_name": "model.served_name", "host": "(slurmrl: every interface)",
    "port": "(slurmrl: the port table)", "tensor_parallel_size": "tp", "data_parallel_size": "dp",
    "data_parallel_size_local": "dp", "data_parallel_address": "(slurmrl: the worker's first node)",
    "data_parallel_rpc_port": "(slurmrl: the port table)", "data_parallel_start_rank": "(slurmrl: per node)",
    "headless": "(slurmrl: per node)", "enable_expert_parallel": "expert_parallel", "dtype": "model.dtype",
    "max_model_len": "model.max_model_len", "trust_remote_code": "model.trust_remote_code",
    "gpu_memory_utilization": "inference.gpu_memory_utilization", "enforce_eager": "inference.enforce_eager",
    "enable_lora": "inference.max_lora_rank", "max_lora_rank": "inference.max_lora_rank",
    "middleware": "inference.auth", "kv_transfer_config": "inference.kv_connector / inference.kv_offload",
    "kv_offloading_backend": "inference.kv_offload", "kv_offloading_size": "inference.kv_offload",
    "kv_events_config": "inference.router.policy", "enable_eplb": "inference.enable_eplb",
    "enable_dbo": "inference.enable_dbo", "enable_return_routed_experts": "inference.return_routed_experts",
    "enable_sleep_mode": "placement.colocate",
}


def _check_vllm_extra(args: dict) -> dict:
    for key in args:
        if not VLLM_ARG_RE.match(key):
            raise ValueError(f"{key!r} is not a vLLM argument name (lower case, underscores: max_num_seqs)")
        if key in VLLM_OWNED:
            owner = VLLM_OWNED[key]
            how = f" ({owner[1:-1].removeprefix('slurmrl: ')})" if owner.startswith("(") else f"; use {owner}"
            raise ValueError(f"{key} is set by slurmrl{how}")
    return args


VllmScalar = bool | Annotated[int, Field(ge=INT64[0], le=INT64[1])] | float | str
VllmExtra = Annotated[dict[str, VllmScalar | list[VllmScalar] | dict[str, VllmScalar]], AfterValidator(_check_vllm_extra)]


class Slurm(Section):
    """Directives for sbatch. Every het group gets the same account/partition/qos/time."""

    job_name: str | None = Field(None, description="Slurm job name; defaults to the recipe name.")
    account: str | None = Field(None, description="`--account` to charge.")
    partition: str | None = Field(None, description="`--partition` for the GPU groups.")
    cpu_partition: str | None = Field(
        None, description="`--partition` for a CPU-only group (own orchestrator); defaults to `partition`."
    )
    qos: str | None = Field(None, description="`--qos`.")
    time: str = Field(
        "01:00:00", description=f"Wall-clock limit, `[D-]HH:MM:SS` or minutes; at most {MAX_DAYS} days."
    )
    nodelist: str | None = Field(None, description="`--nodelist` (applies to the first het group).")
    exclude: str | None = Field(None, description="`--exclude` nodes, for every group.")
    constraint: str | None = Field(None, description="`--constraint` feature expression, for GPU groups.")
    exclusive: bool = Field(False, description="Ask for whole nodes (`--exclusive`).")
    mem: str | None = Field(None, description="`--mem` per node, e.g. `0` (all) or `200G`; at most `64T`.")
    cpus_per_node: int = Field(
        16, ge=1, le=MAX_CPUS,
        description=f"CPUs to request per node; split between the node's components (1-{MAX_CPUS}).",
    )
    gpus_per_node: int = Field(
        8, ge=0, le=MAX_GPUS_PER_NODE,
        description=f"GPUs on each GPU node (0-{MAX_GPUS_PER_NODE}). Each group asks Slurm only for the GPUs "
        "its components use, so a larger number leaves the rest of the node to others.",
    )
    gpu_request: Literal["gpus-per-node", "gres"] = Field(
        "gpus-per-node", description="Ask for GPUs with `--gpus-per-node=N` or `--gres=gpu:N`."
    )
    gpu_type: str | None = Field(None, description="GPU type for the request, e.g. `h100` (`gpu:h100:8`).")
    dependency: str | None = Field(None, description="`--dependency`, e.g. `afterok:1234`.")
    requeue: bool = Field(True, description="Requeue the job on preemption or on the warning signal.")
    signal: str = Field(
        "USR1@120",
        description="Warning signal and seconds before the time limit (`SIG@SECONDS`, seconds "
        f"0-{MAX_SIGNAL_SECONDS} as sbatch allows); the script traps it, asks trainer and orchestrator to "
        "checkpoint, then requeues.",
    )
    heartbeat_timeout: NonNegInt = Field(
        1800, le=7 * 86400,
        description="Seconds without progress after which a hung trainer or orchestrator fails the job "
        "(0 = off; counted from the program's first heartbeat, so model loading is not included; 0-604800, 7 days).",
    )
    max_requeues: NonNegInt = Field(
        3, le=1000,
        description="How many times the warning signal may requeue the job (0-1000). A warning that comes before "
        "every component is ready never requeues: the next attempt would start over the same way.",
    )
    max_total_time: str | None = Field(
        None, description="Total wall-clock budget over all attempts (Slurm time format); no requeue once it is used."
    )
    grace_seconds: int = Field(
        60, ge=0, le=3600,
        description="After a failure or the warning signal: seconds components get to flush before KILL (0-3600).",
    )
    mail_user: str | None = Field(None, description="`--mail-user`.")
    mail_type: str | None = Field(None, description="`--mail-type`, e.g. `END,FAIL`.")
    comment: str | None = Field(None, description="`--comment`.")
    extra_directives: list[str] = Field(
        default_factory=list,
        description="Any other `#SBATCH` options, verbatim, e.g. `--reservation=big` (first het group).",
    )
    switches: dict[str, Annotated[str, Field(pattern=r"^[1-9]\d{0,3}(@(\d{1,3}-\d{1,2}|\d{1,6})(:\d{2}){0,2})?$")]] = Field(
        default_factory=dict,
        description="Topology: per het group (by name, e.g. `inference`), `COUNT[@MAX-WAIT]` for that group's "
        "`--switches`: at most COUNT leaf switches, waiting up to MAX-WAIT (Slurm time) for them.",
    )
    segment: dict[str, Annotated[int, Field(ge=1, le=MAX_NODES)]] = Field(
        default_factory=dict,
        description="Topology: per het group, `--segment` size in nodes (topology/block; Slurm 24.11 or newer: "
        "`submit` refuses it where sbatch lacks the option).",
    )
    nvlink_domain: list[str] = Field(
        default_factory=list,
        description="Het groups whose nodes must share one NVLink domain (one ClusterUUID); `submit --preflight` "
        "checks it where nvidia-smi reports the fabric.",
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
        if v is not None and not re.match(r"^(\d{1,3}-\d{1,2}|\d{1,6})(:\d{2}){0,2}$", v):
            raise ValueError(f"{v!r} is not a Slurm time; use HH:MM:SS, D-HH:MM:SS or minutes")
        if v is not None and time_seconds(v) > MAX_DAYS * 86400:
            raise ValueError(f"{v!r} is more than {MAX_DAYS} days")
        return v

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        if not re.match(r"^(SIG)?[A-Z0-9]+@\d+$", v):
            raise ValueError(f"{v!r} is not SIGNAL@SECONDS, e.g. USR1@120")
        if int(v.split("@")[1]) > MAX_SIGNAL_SECONDS:
            raise ValueError(f"{v!r}: sbatch takes 0-{MAX_SIGNAL_SECONDS} seconds")
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
        if v is not None:
            unit = v[-1] if v[-1] in "KMGT" else "M"  # Slurm's default unit is megabytes
            if int(v.rstrip("KMGT")) * {"K": 2**-10, "M": 1, "G": 2**10, "T": 2**20}[unit] > MAX_MEM_MB:
                raise ValueError(f"{v!r} is more than 64T per node")
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
    cache: str | None = Field(
        None, description="Shared folder of squashfs images: the job imports a registry `image` there once "
        "(`enroot import` under a lock; a concurrent job waits for it) and every step uses the .sqsh.",
    )

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
    max_model_len: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = Field(
        None, description=f"Context length for inference (1-{MAX_TOKENS} tokens)."
    )
    trust_remote_code: bool = Field(False, description="Allow model code from the checkpoint.")
    stage: Literal["shared", "node-local"] = Field(
        "shared", description="`node-local`: before the servers start, copy `path` (a directory) once per node into "
        "`stage_dir` (one task per node, a lock, sha256 checked); the servers read that copy.",
    )
    stage_dir: str = Field(
        "/tmp/slurmrl-models", description="`stage = \"node-local\"`: the node-local folder the copies go to "
        "(one folder per node name inside it).",
    )

    @property
    def served_model_name(self) -> str:
        """The name the OpenAI API serves (``served_name``, else ``path``)."""
        return self.served_name or self.path


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MODULE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _check_targets(names: list[str]) -> list[str]:
    for n in names:
        if not MODULE_NAME_RE.match(n):
            raise ValueError(f"{n!r} is not a module name (the last part of a Linear layer's name, e.g. q_proj)")
    if len(set(names)) != len(names):
        raise ValueError("a module is named twice")
    return names


class Lora(Section):
    """A LoRA policy: the trainer trains low-rank adapters on the frozen base model, and each step's
    adapter (megabytes) is hot-loaded into the inference servers instead of the full weights."""

    rank: int = Field(16, ge=1, le=512, description="Adapter rank r (1-512; inference.max_lora_rank must be at "
                      "least this, and is set to the smallest rank vLLM accepts when left out).")
    alpha: float = Field(32.0, gt=0, le=65536, description="Scaling numerator: the update is B @ A x alpha / rank "
                         "(above 0, at most 65536).")
    dropout: float = Field(0.0, ge=0, le=0.9, description="Dropout on the adapter's input while training "
                           "(0-0.9).")
    target_modules: Annotated[list[str], AfterValidator(_check_targets)] = Field(
        default_factory=lambda: list(LORA_TARGETS), min_length=1, max_length=64,
        description="Linear layers that get adapters, by the last part of their name (every layer whose name ends "
        "so); default the attention and MLP projections of Llama/Qwen/Mistral-style models. vLLM loads adapters "
        "on these modules of its supported architectures.",
    )


class TrainerKnobs(Section):
    """The trainer fields its program reads. ``slurmrl.settings.trainer.TrainerSettings`` extends
    this with what the planner derives, so a default lives here and nowhere else."""

    dataset: str | None = Field(
        None,
        description="SFT: one local JSONL file (prompt/completion or chat messages): an absolute path, or relative "
        "to where the job starts or to the run dir. The trainer downloads nothing: a hub id or URL is refused.",
    )
    lr: float = Field(1e-5, gt=0, le=1, description="AdamW learning rate (above 0, at most 1).")
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW weight decay (0-1).")
    max_grad_norm: float = Field(
        1.0, gt=0, le=1e6,
        description="Clip the global gradient norm to this before each step (above 0, at most 1000000; "
        "a large value leaves gradients unclipped).",
    )
    micro_batch_size: int = Field(4, ge=1, le=4096, description="Sequences per forward/backward per GPU (1-4096).")
    seq_len: int = Field(
        2048, ge=1, le=MAX_TOKENS, description=f"Maximum tokens per sequence (packing length for SFT; 1-{MAX_TOKENS})."
    )
    max_steps: int = Field(100, ge=1, le=MAX_STEPS, description=f"Optimizer steps to run (1-{MAX_STEPS}).")
    checkpoint_every: int = Field(10, ge=1, le=MAX_STEPS, description=f"Steps between checkpoints (1-{MAX_STEPS}).")
    keep_checkpoints: int = Field(3, ge=1, le=1000, description="Checkpoints to keep (1-1000).")
    gradient_checkpointing: bool | Literal["auto"] = Field(
        "auto",
        description='Recompute activations in backward: true or false to force it, "auto" to recompute only where '
        "the step's estimated activations would not fit in the device's memory.",
    )
    compile: bool = Field(
        True, description="On CUDA, torch.compile each decoder layer (false: run eager; the CPU never compiles).",
    )
    dtype: Literal["bfloat16", "float32"] = Field("bfloat16", description="Training dtype (fp32 where no bf16).")
    clip_eps: float = Field(
        0.2, gt=0, le=1, description="RL: importance-ratio clip range, ratios outside 1 +- clip_eps (above 0, at most 1)."
    )
    kl_coef: float = Field(0.0, ge=0, le=10, description="RL: KL penalty to the reference model (0 = off; 0-10).")
    seed: int = Field(0, ge=0, le=MAX_SEED, description=f"Random seed (0-{MAX_SEED}).")
    peak_tflops: float | None = Field(
        None, gt=0, le=1e6,
        description="Peak dense TFLOP/s of one trainer device in the training dtype, for the MFU metric (above 0, "
        "at most 1000000); default: the datasheet figure of known GPUs in bfloat16 (A100, H100, H200, B200, "
        "GB200), else none and MFU is not reported.",
    )
    lora: Lora | None = Field(
        None,
        description="RL: train a LoRA adapter instead of the full weights (`[trainer.lora]`); the servers hot-load "
        "each step's adapter, and the KL reference is the base model with adapters off. See docs/rl.md.",
    )


SFT_BATCH_SIZE = 32  # trainer.batch_size of kind sft when the recipe leaves it out; see global_batch()


class Trainer(TrainerKnobs):
    nodes: int = Field(1, ge=1, le=MAX_NODES, description=f"Trainer nodes (1-{MAX_NODES}).")
    gpus_per_node: Annotated[int, Field(ge=0, le=MAX_GPUS_PER_NODE)] | None = Field(
        None,
        description="GPUs per node for the trainer; defaults to all (or what inference leaves when colocated) "
        f"(0-{MAX_GPUS_PER_NODE}).",
    )
    batch_size: Annotated[int, Field(ge=1, le=2**20)] | None = Field(
        None,
        description=f"Sequences per optimizer step (global; 1-{2**20}). Kind `sft`: {SFT_BATCH_SIZE} when left out. "
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
    environment_args: dict[str, bool | Annotated[int, Field(ge=INT64[0], le=INT64[1])] | float | str] = Field(
        default_factory=dict,
        description="Keyword arguments for the environment's constructor, e.g. `{ few_shot = 2 }` for "
        "`arithmetic` (built-in environments' arguments are checked by `plan`).",
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


class Orchestrator(OrchestratorKnobs):
    placement: Literal["trainer", "inference", "own"] = Field(
        "trainer",
        description="Where the one orchestrator runs: the trainer's head node, the first inference node, "
        "or its own CPU-only het group.",
    )
    cpus: int = Field(2, ge=1, le=MAX_CPUS, description=f"CPUs for the orchestrator (1-{MAX_CPUS}).")
    env: EnvMap = Field(default_factory=dict, description="Extra environment for the orchestrator step.")


RouterPolicy = Literal[
    "consistent_hash", "round_robin", "random", "power_of_two", "cache_aware", "kv_aware", "sticky_least_loaded"
]


class Router(Section):
    """vllm-router (0.1.17). Each option belongs to a policy; `plan` refuses an option no policy in use
    reads, and renders only values that differ from vllm-router's defaults (the defaults here)."""

    enabled: bool | None = Field(
        None, description="Run vllm-router on the first inference node; default: when there is more than one server."
    )
    policy: RouterPolicy = Field(
        "consistent_hash",
        description="Routing policy: `consistent_hash` keys on `session_header`; `round_robin`, `random`; "
        "`power_of_two` (the less loaded of two random workers); `cache_aware` (prefix tree of past requests "
        "per worker); `kv_aware` (the servers' KV-cache events: each server publishes them over ZMQ); "
        "`sticky_least_loaded` (a session stays on the least loaded worker it first got).",
    )
    prefill_policy: RouterPolicy | None = Field(
        None, description="Mode `pd`: the policy that picks a prefill server; default: `policy`."
    )
    decode_policy: RouterPolicy | None = Field(
        None, description="Mode `pd`: the policy that picks a decode server; default: `policy`."
    )
    session_header: Literal[
        "X-Session-ID", "X-User-ID", "X-Tenant-ID", "X-Request-ID", "X-Correlation-ID", "X-Trace-ID"
    ] = Field(
        "X-Session-ID",
        description="Header clients send to key consistent hashing. vllm-router reads these headers itself, in "
        "this order, and has no option to pick one: any value but the default is refused.",
    )
    cache_threshold: float = Field(
        0.3, ge=0, le=1,
        description="`cache_aware`: prefix-match rate above which a request goes to the worker holding the prefix, "
        "else to the worker with the smallest tree (0-1).",
    )
    balance_abs_threshold: int = Field(
        64, ge=0, le=1_000_000,
        description="`cache_aware`: balance load instead of caching when the most and least loaded workers differ "
        "by more than this many requests and by `balance_rel_threshold` (0-1000000).",
    )
    balance_rel_threshold: float = Field(
        1.5, ge=1, le=1000,
        description="`cache_aware`: ... and when the most loaded worker has more than this many times the least "
        "loaded's requests (1-1000).",
    )
    eviction_interval_secs: int = Field(
        120, ge=1, le=86400, description="`cache_aware`: seconds between prefix-tree evictions (1-86400)."
    )
    max_tree_size: int = Field(
        2**25, ge=1, le=2**32,
        description=f"`cache_aware`: characters each worker's prefix tree keeps, per model (1-{2**32}).",
    )
    router_temperature: float = Field(
        0.0, ge=0, le=100,
        description="`kv_aware`, mode `replicas`: softmax temperature over worker costs; 0 picks the cheapest (0-100).",
    )
    kv_penalty_host: float = Field(
        0.8, ge=0, le=1,
        description="`kv_aware` where it reads KV events: credit for KV blocks held in host memory (0-1).",
    )
    kv_penalty_external: float = Field(
        0.6, ge=0, le=1,
        description="`kv_aware` where it reads KV events: credit for KV blocks in an external store (0-1).",
    )
    kv_penalty_disk: float = Field(
        0.3, ge=0, le=1, description="`kv_aware` where it reads KV events: credit for KV blocks on disk (0-1)."
    )
    kv_aware_session_affinity_ttl_secs: Annotated[int, Field(ge=1, le=31_536_000)] | None = Field(
        None,
        description="`kv_aware` (mode `pd`: the decode policy): keep a session on its worker while it is idle "
        "less than this many seconds; default: no affinity (1-31536000).",
    )
    kv_event_block_size: int = Field(
        16, ge=1, le=1024,
        description="`kv_aware`, mode `replicas`: tokens per KV block; the servers get the same `--block-size` "
        "(mode `pd`: vllm-router reads prefill events in blocks of 16, the prefill servers get 16) (1-1024).",
    )
    kv_event_model: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description="`kv_aware`, mode `replicas`: the model identity the router keys KV events by; default: the "
        "served model name.",
    )
    request_timeout_secs: int = Field(
        1800, ge=1, le=7 * 86400, description="Seconds a request may take through the router (1-604800)."
    )
    max_payload_size: int = Field(
        512 * 2**20, ge=1024, le=2**34, description=f"Largest request body the router takes (bytes; 1024-{2**34})."
    )
    retry_max_retries: int = Field(
        5, ge=1, le=100, description="Attempts per request across workers; 1 = no retry (1-100)."
    )
    retry_initial_backoff_ms: int = Field(
        50, ge=1, le=3_600_000, description="Milliseconds before the first retry (1-3600000)."
    )
    retry_max_backoff_ms: int = Field(
        30_000, ge=1, le=3_600_000, description="Longest wait between retries, in milliseconds (1-3600000)."
    )
    retry_backoff_multiplier: float = Field(
        1.5, ge=1, le=100, description="Each retry waits this many times longer than the one before (1-100)."
    )
    retry_jitter_factor: float = Field(
        0.2, ge=0, le=1, description="Random share of each retry wait (0-1)."
    )
    extra_args: list[str] = Field(default_factory=list, description="Extra `vllm-router` arguments.")


class KVOffload(Section):
    kind: Literal["none", "cpu", "cpu_disk", "mooncake"] = Field(
        "none", description="KV-cache offload: vLLM native to CPU, CPU then disk, or a Mooncake store."
    )
    cpu_gb: float = Field(
        0, ge=0, le=65536, description="CPU memory per inference node for offloaded KV (GB; 0-65536)."
    )
    disk_path: str | None = Field(None, description="`cpu_disk` / `mooncake`: local disk folder for KV.")
    disk_gb: float = Field(0, ge=0, le=2**20, description=f"Disk budget per node (GB; 0-{2**20}).")
    mooncake_protocol: Literal["tcp", "rdma"] = Field("rdma", description="Mooncake transfer protocol.")
    mooncake_device: str | None = Field(None, description="RDMA device names for Mooncake, e.g. `mlx5_0`.")


class PDRole(Section):
    """One side of prefill/decode disaggregation."""

    replicas: int = Field(
        1, ge=1, le=MAX_JOB_GPUS, description=f"Workers of this role: vLLM servers, each tp x dp GPUs (1-{MAX_JOB_GPUS})."
    )
    tp: int = Field(
        1, ge=1, le=MAX_GPUS_PER_NODE,
        description=f"Tensor-parallel size per engine, within one node (1-{MAX_GPUS_PER_NODE}).",
    )
    dp: int = Field(
        1, ge=1, le=MAX_JOB_GPUS,
        description="Data-parallel ranks in one server (worker); a worker of tp x dp GPUs larger than a node "
        f"spans tp x dp / GPUs-per-node nodes: one vLLM deployment, headless ranks on its other nodes (1-{MAX_JOB_GPUS}).",
    )
    nodes_per_worker: Annotated[int, Field(ge=1, le=MAX_NODES)] | None = Field(
        None,
        description="Nodes one worker spans; default: as few as hold its tp x dp GPUs. Give it to spread a worker "
        f"thinner, e.g. when prefill and decode share nodes (1-{MAX_NODES}).",
    )
    expert_parallel: bool = Field(False, description="`--enable-expert-parallel` for this role's workers.")
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] | None = Field(
        None, description=f"Nodes for this role; default: as few as fit the replicas (1-{MAX_NODES})."
    )
    extra_args: list[str] = Field(default_factory=list, description="Extra `vllm serve` arguments for this role.")
    env: EnvMap = Field(default_factory=dict, description="Extra environment for this role.")


class Dynamo(Section):
    """NVIDIA Dynamo in place of vLLM servers + vllm-router (`inference.backend = "dynamo"`): etcd (and NATS
    when a plane needs it) and Dynamo's OpenAI frontend on the first inference node, workers of one engine."""

    engine: Literal["vllm", "trtllm", "mocker"] = Field(
        "vllm",
        description="Worker: `python -m dynamo.vllm`, `dynamo.trtllm` (one MPI rank per GPU through "
        "`srun --mpi=pmix` and `trtllm-llmapi-launch`; a worker of `tp` GPUs may then span tp / GPUs-per-node "
        "nodes), or `dynamo.mocker` (Dynamo's simulated engine: no GPU work, for tests and dry runs).",
    )
    engine_config: str | None = Field(
        None,
        description="`trtllm`: engine-config YAML for the workers (`--extra-engine-args`; its parallel sizes "
        "must match `tp`). Mode `pd`: the default of both roles.",
    )
    prefill_engine_config: str | None = Field(None, description="`trtllm`, mode `pd`: the prefill workers' YAML.")
    decode_engine_config: str | None = Field(None, description="`trtllm`, mode `pd`: the decode workers' YAML.")
    request_plane: Literal["tcp", "nats"] = Field(
        "tcp", description="How the frontend sends requests to workers (`--request-plane`); `nats` starts NATS."
    )
    event_plane: Literal["zmq", "nats"] = Field(
        "zmq", description="How workers publish KV and load events (`--event-plane`); `nats` starts NATS."
    )
    router_mode: Literal["round-robin", "random", "kv"] | None = Field(
        None, description="The frontend's `--router-mode`; default: Dynamo's (round-robin)."
    )
    etcd_endpoints: str | None = Field(
        None,
        description="Use this etcd (`http://HOST:PORT`, comma-separated for several) instead of starting one "
        "on the head node.",
    )
    nats_server: str | None = Field(
        None, description="Use this NATS server (`nats://HOST:PORT`) instead of starting one when a plane is `nats`."
    )
    speedup_ratio: float | None = Field(
        None, ge=0, le=1_000_000,
        description="`mocker`: simulated time runs this many times faster (0 = no delays; 0-1000000).",
    )
    frontend_args: list[str] = Field(default_factory=list, description="Extra `python -m dynamo.frontend` arguments.")
    extra_args: list[str] = Field(default_factory=list, description="Extra arguments for every worker.")
    env: EnvMap = Field(
        default_factory=dict, description="Environment for every Dynamo process (etcd, NATS, frontend, workers)."
    )

    @field_validator("etcd_endpoints")
    @classmethod
    def _etcd(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"https?://[^\s,/]+(,https?://[^\s,/]+)*", v):
            raise ValueError(f"{v!r} is not http://HOST:PORT (comma-separated for several)")
        return v

    @field_validator("nats_server")
    @classmethod
    def _nats(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"(nats|tls)://[^\s,/]+", v):
            raise ValueError(f"{v!r} is not nats://HOST:PORT")
        return v


class Inference(Section):
    backend: Literal["vllm", "dynamo"] = Field(
        "vllm",
        description="`vllm`: vLLM servers (and vllm-router); `dynamo`: NVIDIA Dynamo's frontend and workers "
        "(`[inference.dynamo]`), kind `inference` only.",
    )
    mode: Literal["replicas", "wide_ep", "pd"] = Field(
        "replicas",
        description="`replicas`: independent servers; `wide_ep`: one data-parallel deployment across nodes; "
        "`pd`: prefill/decode disaggregation.",
    )
    nodes: int = Field(1, ge=1, le=MAX_NODES, description=f"Inference nodes (`replicas`, `wide_ep`; 1-{MAX_NODES}).")
    gpus_per_node: Annotated[int, Field(ge=0, le=MAX_GPUS_PER_NODE)] | None = Field(
        None,
        description=f"GPUs per node for inference; defaults to all (required when colocated; 0-{MAX_GPUS_PER_NODE}).",
    )
    tp: int = Field(
        1, ge=1, le=MAX_GPUS_PER_NODE, description=f"Tensor-parallel size, within one node (1-{MAX_GPUS_PER_NODE})."
    )
    dp: int = Field(
        1, ge=1, le=MAX_JOB_GPUS,
        description="Data-parallel ranks in one server (worker). A worker of tp x dp GPUs larger than a node spans "
        "tp x dp / GPUs-per-node nodes (one vLLM deployment, headless ranks on its other nodes) and `nodes` holds "
        "nodes / that many workers. `wide_ep`: default all ranks of all nodes, one deployment "
        f"(1-{MAX_JOB_GPUS}).",
    )
    expert_parallel: bool | None = Field(
        None, description="`--enable-expert-parallel`; default on for `wide_ep`, off otherwise."
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1,
        description="Fraction of GPU memory for vLLM (set for you when sharing a GPU; above 0, at most 1).",
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
    max_lora_rank: Literal[VLLM_LORA_RANKS] | None = Field(
        None,
        description="Enable LoRA adapters loaded at run time (`slurmrl.runtime.admin lora-load`) up to this rank: "
        f"one of {', '.join(map(str, VLLM_LORA_RANKS))} (what vLLM accepts).",
    )
    kv_connector: Literal["NixlConnector", "MooncakeConnector"] = Field(
        "NixlConnector",
        description="P/D: KV transfer connector: NIXL (decode pulls), or Mooncake's transfer engine (prefill pushes; "
        "vllm-router asks each prefill server's bootstrap port). vLLM 0.32 removed P2pNcclConnector.",
    )
    kv_transfer_protocol: Literal["rdma", "tcp"] = Field(
        "rdma", description="P/D with MooncakeConnector: the transfer engine's protocol."
    )
    kv_load_failure_policy: Literal["fail", "recompute"] = Field(
        "fail",
        description="P/D: when KV from the peer cannot be loaded, fail the request or recompute the missing blocks "
        "(vLLM's `kv_load_failure_policy`).",
    )
    kv_buffer_device: Literal["gpu", "cpu"] = Field(
        "gpu",
        description="P/D with NixlConnector: stage KV in GPU memory, or in host memory (`cpu`: for fabrics "
        "without GPUDirect RDMA).",
    )
    share_nodes: bool = Field(
        False,
        description="P/D: prefill and decode servers on the same nodes, each role on its own GPUs (prefill's "
        "first); the roles' `nodes` must agree.",
    )
    prefill: PDRole | None = Field(None, description="P/D: the prefill role.")
    decode: PDRole | None = Field(None, description="P/D: the decode role.")
    dynamo: Dynamo | None = Field(None, description="Dynamo's services and workers (`backend = \"dynamo\"`).")
    router: Router = Field(default_factory=Router, description="vllm-router in front of the servers.")
    kv_offload: KVOffload = Field(default_factory=KVOffload, description="KV-cache offload.")
    enable_eplb: bool = Field(
        False, description="`--enable-eplb`: expert-parallel load balancing (needs expert parallel in every worker)."
    )
    enable_dbo: bool = Field(
        False, description="`--enable-dbo`: dual-batch overlap of compute and expert all-to-all (needs expert parallel)."
    )
    return_routed_experts: bool = Field(
        False,
        description="`--enable-return-routed-experts`: responses carry the experts each token was routed to (router "
        "replay for MoE RL); not with mode `pd` or KV offload, which vLLM does not support with it.",
    )
    vllm_extra: VllmExtra = Field(
        default_factory=dict,
        description="vLLM engine arguments by name, e.g. `{ max_num_seqs = 256, enable_chunked_prefill = true }`: "
        "`--max-num-seqs 256`, `--enable-chunked-prefill` (false: `--no-...`; tables and lists as JSON). Names "
        "slurmrl sets itself are refused with the field that sets them.",
    )
    extra_args: list[str] = Field(default_factory=list, description="Extra `vllm serve` arguments.")
    env: EnvMap = Field(default_factory=dict, description="Extra environment for the inference steps.")
    startup_timeout: int = Field(
        1800, ge=1, le=86400, description="Seconds to wait for servers to answer /health (1-86400, one day)."
    )


# vllm bench serve flags the [benchmark] table sets itself: per grid point, or where results go
BENCH_MANAGED_FLAGS = (
    "--base-url", "--host", "--port", "--max-concurrency", "--num-prompts", "--input-len", "--output-len",
    "--random-input-len", "--random-output-len", "--request-rate", "--save-result", "--append-result",
    "--save-detailed", "--result-dir", "--result-filename",
)
MAX_BENCH_POINTS = 256  # grid points (concurrencies x input_lens x output_lens)
MAX_BENCH_REQUESTS = 10**7  # requests over the whole grid


class Benchmark(Section):
    """A load test of the job's own endpoint once every server is ready: vLLM's load generator
    (`vllm bench serve`, random prompts) over a grid of concurrency x input length x output length."""

    concurrencies: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=lambda: [1, 8, 32], min_length=1, max_length=64,
        description="Requests in flight at once (`--max-concurrency`), one grid point each (1-64 values, "
        "each 1-65536).",
    )
    input_lens: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = Field(
        default_factory=lambda: [512], min_length=1, max_length=64,
        description=f"Prompt lengths in tokens, random prompts (1-64 values, each 1-{MAX_TOKENS}).",
    )
    output_lens: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = Field(
        default_factory=lambda: [128], min_length=1, max_length=64,
        description=f"Tokens generated per request, end of sequence ignored (1-64 values, each 1-{MAX_TOKENS}).",
    )
    num_prompts: int = Field(200, ge=1, le=1_000_000, description="Requests per grid point (1-1000000).")
    request_rate: float | None = Field(
        None, gt=0, le=1_000_000,
        description="Requests per second each point sends (Poisson arrivals); default: all at once, held to "
        "the point's concurrency (above 0, at most 1000000).",
    )
    then: Literal["stop", "serve"] = Field(
        "stop",
        description="After the benchmark: `stop` ends the job (it completes when the benchmark succeeds); "
        "`serve` keeps the servers serving until the job is cancelled or runs out of time.",
    )
    timeout: int = Field(
        3600, ge=1, le=7 * 86400,
        description="Seconds the whole grid may take; past it the benchmark fails the job (1-604800, 7 days).",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="Extra `vllm bench serve` arguments for every point, e.g. `--temperature 0` or "
        "`--num-warmups 4`; the flags the grid sets itself are refused.",
    )

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for a in v:
            flag = a.split("=", 1)[0]
            if flag in BENCH_MANAGED_FLAGS:
                raise ValueError(f"{flag} is set by the benchmark itself (grid point, target or results folder)")
        return v

    @model_validator(mode="after")
    def _grid(self) -> Benchmark:
        points = len(self.concurrencies) * len(self.input_lens) * len(self.output_lens)
        if points > MAX_BENCH_POINTS:
            raise UserError("benchmark.concurrencies", f"a grid of {points} points; at most {MAX_BENCH_POINTS}")
        if points * self.num_prompts > MAX_BENCH_REQUESTS:
            raise UserError("benchmark.num_prompts", f"{points} points x {self.num_prompts} requests is more than "
                            f"{MAX_BENCH_REQUESTS} requests")
        for name in ("concurrencies", "input_lens", "output_lens"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise UserError(f"benchmark.{name}", f"{values} lists a value twice")
        return self

    def points(self) -> list[tuple[int, int, int]]:
        """(concurrency, input length, output length) of every grid point, in run order."""
        return [(c, i, o) for i in self.input_lens for o in self.output_lens for c in self.concurrencies]


JUDGE_TEMPLATES = {  # judge.template when left out, per judge.kind
    "generative": "Rate the answer from 0 (wrong) to 10 (right).\nQuestion: {prompt}\nAnswer: {completion}\nRating:",
    "reward_model": "{prompt}{completion}",
}


def template_fields(template: str) -> list[str]:
    """The placeholders of a judge template (``{prompt}``, ``{completion}``, a task's fields), or a
    ValueError saying what is wrong: only plain names, no format specs; ``{{``/``}}`` are braces."""
    import string

    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"{e} (write {{{{ and }}}} for literal braces)") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise ValueError(f"placeholder {{{name}}} is not a plain name such as {{prompt}} or {{completion}}")
        if spec or conversion:
            raise ValueError(f"placeholder {{{name}}} takes no format spec or conversion")
        names.append(name)
    if "completion" not in names:
        raise ValueError("has no {completion} placeholder: the judge would never see what it scores")
    return names


class JudgeKnobs(Section):
    """The [judge] fields the orchestrator's scoring client reads (``slurmrl.runtime.judge_client``);
    ``slurmrl.settings.judge.JudgeSettings`` extends this with what the planner derives."""

    kind: Literal["generative", "reward_model"] = Field(
        "generative",
        description="`generative`: an LLM judge; it completes the template (greedy) and the reward is the first number "
        "of its reply over `max_score`. `reward_model`: a sequence-classification model served by vLLM's pooling "
        "runner (`--runner pooling`); the reward is its score for the template's text (`/classify`, no activation).",
    )
    template: Annotated[str, Field(min_length=1, max_length=65536)] | None = Field(
        None,
        description="What the judge reads per sample: `{completion}`, `{prompt}` and the task's own fields (e.g. "
        "`{target}`) as placeholders, `{{`/`}}` for braces. Default: `generative` "
        f"{JUDGE_TEMPLATES['generative']!r}; `reward_model` {JUDGE_TEMPLATES['reward_model']!r}.",
    )
    max_tokens: int = Field(
        16, ge=1, le=4096, description="`generative`: tokens the judge may write per reply (1-4096)."
    )
    max_score: float = Field(
        10.0, gt=0, le=1e6,
        description="`generative`: the top of the judge's scale; the reward is the reply's first number clamped to "
        "0..max_score, over max_score (a reply without a number scores 0; above 0, at most 1000000).",
    )
    batch_size: int = Field(
        16, ge=1, le=4096,
        description="Samples per request to the judge (one `/v1/completions` or `/classify` call; 1-4096). A step's "
        "requests go to the judge servers at once, two per server.",
    )
    timeout: int = Field(120, ge=1, le=86400, description="Seconds one request to the judge may take (1-86400).")
    retries: int = Field(
        3, ge=0, le=100,
        description="Tries after a failed request (connection refused or reset, timeout, HTTP 429/5xx), each on the "
        "next judge server after a doubling pause from 1 s; then the orchestrator fails naming the judge (0-100).",
    )

    @field_validator("template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None:
            template_fields(v)
        return v


class Judge(JudgeKnobs):
    """A judge or reward model served by vLLM inside the job; the orchestrator scores rollouts through it
    (environment `judge`, or a custom one with `use_judge`). docs/rl.md: "Reward from a served judge"."""

    model: Model = Field(description="The judge's model (`[judge.model]`: path, served_name, dtype, max_model_len, ...).")
    placement: Literal["own", "inference"] = Field(
        "own",
        description="`own`: its own het group of `nodes` nodes; `inference`: on the first `nodes` inference nodes "
        "(colocated RL: the one node), on GPUs after the ones inference and the trainer take.",
    )
    nodes: int = Field(1, ge=1, le=MAX_NODES, description=f"Nodes with judge servers (1-{MAX_NODES}).")
    gpus_per_node: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)] | None = Field(
        None,
        description=f"GPUs per node for the judge, `tp` each server; default `tp` (one server per node; "
        f"1-{MAX_GPUS_PER_NODE}).",
    )
    tp: int = Field(1, ge=1, le=MAX_GPUS_PER_NODE, description=f"Tensor-parallel size of each judge server (1-{MAX_GPUS_PER_NODE}).")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Fraction of GPU memory for the judge's vLLM (above 0, at most 1)."
    )
    enforce_eager: bool = Field(False, description="Disable CUDA graphs / torch.compile in the judge's vLLM.")
    extra_args: list[str] = Field(default_factory=list, description="Extra arguments for the judge's vLLM server.")
    env: EnvMap = Field(default_factory=dict, description="Extra environment for the judge's step.")
    startup_timeout: int = Field(
        1800, ge=1, le=86400, description="Seconds to wait for the judge to answer /health (1-86400, one day)."
    )


MAX_SWEEP_POINTS = 256  # run dirs one sweep renders


class Sweep(Section):
    """A grid of recipe values (`slurmrl sweep RECIPE`): one complete run dir per point, submitted as
    a job array where Slurm allows one (else as one job per point), at most `max_running` at once."""

    grid: dict[
        Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+$|^[A-Za-z0-9_-]+$")],
        Annotated[list[bool | int | float | str], Field(min_length=1, max_length=MAX_SWEEP_POINTS)],
    ] = Field(
        default_factory=dict,
        description="Field path -> the values it takes, e.g. `{ \"trainer.lr\" = [1e-6, 3e-6], \"inference.tp\" = [1, 2] }`; "
        "every combination is a point (`--grid KEY=V1,V2` adds or replaces a key).",
    )
    max_running: Annotated[int, Field(ge=1, le=MAX_SWEEP_POINTS)] | None = Field(
        None, description=f"Points running at once (1-{MAX_SWEEP_POINTS}); default: all (`--max-running N`)."
    )


class Placement(Section):
    colocate: Literal[False, True, "hybrid"] = Field(
        False,
        description="RL on one node: trainer and inference share the node, GPUs split between them. `\"hybrid\"`: "
        "the hybrid engine, vLLM (sleep mode) and the trainer take turns on the same GPUs (needs `share_gpus`, "
        "CUDA GPUs and `orchestrator.max_off_policy_steps = 0`; docs/rl.md).",
    )
    share_gpus: bool = Field(
        False, description="Trainer and inference use the same GPUs (e.g. one GPU); needs `colocate`."
    )
    port_base: Annotated[int, Field(ge=1024, le=65000)] | None = Field(
        None,
        description="Fixed first port instead of one derived from the job id (debugging only; 1024-65000, so the "
        "job's block of ports stays below 65536).",
    )


class Recipe(Section):
    name: str = Field(pattern=NAME_RE, description="Run name; also the run dir name.")
    kind: Literal["sft", "rl", "inference"] = Field(description="What the job does.")
    output_dir: str = Field("runs", description="Parent folder of run dirs (relative to the current directory).")
    templates_dir: str | None = Field(
        None,
        description="Folder of ejected templates (`slurmrl templates eject DIR`) to render with instead "
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
    benchmark: Benchmark | None = Field(
        None, description="Load test of the job's endpoint once it is ready (kind `inference`)."
    )
    sweep: Sweep | None = Field(
        None, description="A grid of values for this recipe's fields; rendered and submitted by `slurmrl sweep`."
    )
    judge: Judge | None = Field(
        None, description="A judge or reward model served by vLLM in the job, for rewards (kind `rl`)."
    )

    @model_validator(mode="after")
    def _size(self) -> Recipe:
        """The whole job's GPUs, before any planning work grows with them."""
        parts = job_gpus(self)
        total = sum(n for _, n in parts)
        if total > MAX_JOB_GPUS:
            field = max(parts, key=lambda p: p[1])[0]
            # UserError passes through pydantic untouched: the message names the field, not the recipe.
            raise UserError(
                field, f"the job would use {total} GPUs; at most {MAX_JOB_GPUS} are supported in one job "
                "(the largest clusters hold about 100k)",
            )
        return self


def time_seconds(text: str) -> int:
    """Seconds in a Slurm time: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    days, _, rest = text.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:
        h, m, sec = (parts + [0, 0])[:3]
    else:
        h, m, sec = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


def job_gpus(r: Recipe) -> list[tuple[str, int]]:
    """(field, GPUs) for each part of the job, as the recipe asks (an upper bound where parts share nodes)."""
    gpn, out = r.slurm.gpus_per_node, []
    if r.trainer is not None:
        t = r.trainer.gpus_per_node
        out.append(("trainer.nodes", r.trainer.nodes * (gpn if t is None else t)))
    inf = r.inference
    if inf is not None and inf.mode == "pd":
        for name, role in (("prefill", inf.prefill), ("decode", inf.decode)):
            if role is not None:
                out.append((f"inference.{name}.replicas", max(role.replicas * role.tp, (role.nodes or 0) * gpn)))
    elif inf is not None:
        g = inf.gpus_per_node
        out.append(("inference.nodes", inf.nodes * (gpn if g is None else g)))
    if r.judge is not None:
        out.append(("judge.nodes", r.judge.nodes * (r.judge.gpus_per_node or r.judge.tp)))
    return out


def global_batch(r: Recipe) -> int:
    """Sequences per optimizer step, the one place ``trainer.batch_size`` is resolved: kind ``rl``
    samples prompts_per_step x rollouts_per_prompt (a recipe's batch_size must agree, see
    ``slurmrl.plan.rules``); kind ``sft`` takes batch_size, or ``SFT_BATCH_SIZE``."""
    if r.kind == "rl":
        o = r.orchestrator or Orchestrator()
        return o.prompts_per_step * o.rollouts_per_prompt
    return r.trainer.batch_size or SFT_BATCH_SIZE
