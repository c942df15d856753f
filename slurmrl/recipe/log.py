"""[log]: how much the job's engines and libraries log (``slurmrl.plan.log_env`` turns it into the
variables each one reads)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from slurmrl.settings.section import Section

LogLevel = Literal["debug", "info", "warning", "error"]


class Log(Section):
    """One logging level for every step of the job, as prime-rl's `log.level`: the planner exports each
    engine's and library's own variable for it in the script's header, where it can be read and edited."""

    level: LogLevel = Field(
        "info",
        description="`info` (default): every program at its own default, nothing exported. `debug`: vLLM "
        "(`VLLM_LOGGING_LEVEL=DEBUG`), Dynamo (`DYN_LOG=debug`), NCCL (`NCCL_DEBUG=INFO`) and torch.distributed "
        "(`TORCH_DISTRIBUTED_DEBUG=DETAIL`, `TORCH_CPP_LOG_LEVEL=INFO`: slower collectives, for debugging "
        "only); `warning`/`error`: vLLM, Dynamo and NCCL at that level. slurmrl's own steps print the "
        "same lines at every level (progress and errors only).",
    )
