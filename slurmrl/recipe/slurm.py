"""[slurm]: the directives for sbatch."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from slurmrl.recipe.fields import _check_single_line
from slurmrl.recipe.slurm_values import (
    TYPED_OPTIONS,
    WORD_OPTIONS,
    MailTypes,
    Signal,
    Switches,
    TimeBudget,
    TimeLimit,
    Word,
    check_memory,
    check_word,
)
from slurmrl.settings.limits import MAX_CPUS, MAX_DAYS, MAX_GPUS_PER_NODE, MAX_MEM_MB, MAX_NODES, MAX_SIGNAL_SECONDS
from slurmrl.settings.section import NonNegInt, Section


class Slurm(Section):
    """Directives for sbatch. Every het group gets the same account/partition/qos/time."""

    job_name: str | None = Field(None, description="Slurm job name; defaults to the recipe name.")
    account: Word | None = Field(None, description="`--account` to charge.")
    partition: Word | None = Field(None, description="`--partition` for the GPU groups.")
    cpu_partition: Word | None = Field(
        None, description="`--partition` for a CPU-only group (own orchestrator); defaults to `partition`."
    )
    qos: Word | None = Field(None, description="`--qos`.")
    time: TimeLimit = Field(
        "01:00:00", description="Wall-clock limit in any form sbatch takes: minutes, `MM:SS`, `HH:MM:SS`, `D-HH`, "
        f"`D-HH:MM` or `D-HH:MM:SS`; at most {MAX_DAYS} days, or `UNLIMITED` (also `INFINITE`, `0`) for none.",
    )
    nodelist: str | None = Field(None, description="`--nodelist` (applies to the first het group).")
    exclude: str | None = Field(None, description="`--exclude` nodes, for every group.")
    constraint: Word | None = Field(None, description="`--constraint` feature expression, for GPU groups.")
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
    gpu_type: Word | None = Field(None, description="GPU type for the request, e.g. `h100` (`gpu:h100:8`).")
    dependency: str | None = Field(None, description="`--dependency`, e.g. `afterok:1234`.")
    requeue: bool = Field(True, description="Requeue the job on preemption or on the warning signal.")
    signal: Signal = Field(
        "USR1@120",
        description="Warning signal and seconds before the time limit, as sbatch's `--signal` takes it: "
        f"`[R:]SIG[@SECONDS]`, SIG one of sbatch's names (HUP, INT, QUIT, ABRT, ALRM, USR1, USR2, URG, CONT, TSTP, "
        "TTIN, TTOU, XCPU; with or without `SIG`) or a number 1-64 (written as the number), "
        f"seconds 0-{MAX_SIGNAL_SECONDS} (default 60); "
        "always sent to the batch shell, which traps it, asks trainer and orchestrator to checkpoint, then requeues "
        "(KILL, STOP, TERM and CHLD cannot serve).",
    )
    heartbeat_timeout: NonNegInt = Field(
        1800, le=7 * 86400,
        description="Seconds without progress after which a hung trainer or orchestrator fails the job "
        "(0 = off; counted from the program's first heartbeat, so model loading is not included; 0-604800, 7 days).",
    )
    max_requeues: NonNegInt = Field(
        3, le=1000,
        description="How many times the job may be requeued (0-1000), one count for the warning signal's requeues and "
        "the node faults' (a node Slurm, the node check or a task's SIGBUS finds bad: requeued without the node); a "
        "manual `scontrol requeue` uses none. A warning that comes before every component is ready never requeues: "
        "the next attempt would start over the same way; an application failure never requeues. Only with "
        "`requeue = true`.",
    )
    max_total_time: TimeBudget | None = Field(
        None, description="Total wall-clock budget over all attempts (Slurm time format); no requeue once it is used. Only with "
        "`requeue = true`."
    )
    grace_seconds: int = Field(
        60, ge=0, le=3600,
        description="After a failure or the warning signal: seconds components get to flush before KILL (0-3600).",
    )
    mail_user: str | None = Field(None, description="`--mail-user`; only with `mail_type` (Slurm sends no mail without).")
    mail_type: MailTypes | None = Field(
        None, description="`--mail-type`: a comma-separated list of NONE, BEGIN, END, FAIL, REQUEUE, ALL, "
        "INVALID_DEPEND, STAGE_OUT, TIME_LIMIT, TIME_LIMIT_90, TIME_LIMIT_80, TIME_LIMIT_50, ARRAY_TASKS, e.g. `END,FAIL`.",
    )
    comment: str | None = Field(None, description="`--comment`.")
    extra_directives: list[str] = Field(
        default_factory=list,
        description="Any other `#SBATCH` options, verbatim, e.g. `--reservation=big` (first het group).",
    )
    switches: dict[str, Switches] = Field(
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

    @field_validator("extra_directives")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        _check_single_line(v, "extra directives")
        for d in v:
            if not d.startswith("-"):
                raise ValueError(f"{d!r} must be an sbatch option starting with '-'")
            option, eq, value = d.partition("=")
            if eq and option in WORD_OPTIONS:
                check_word(value)
            if option in TYPED_OPTIONS:
                TYPED_OPTIONS[option](value)  # as the field of that type checks it (ValueError: refused)
        return v

    @field_validator("mem")
    @classmethod
    def _mem(cls, v: str | None) -> str | None:
        return None if v is None else check_memory(v, MAX_MEM_MB)
