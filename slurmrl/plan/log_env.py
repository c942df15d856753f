"""``[log] level`` as the variables each engine and library reads: one table, exported job-wide.

A recipe that also sets one of these variables itself (``env`` or a component's ``env``) says the
same thing twice; the planner refuses it, naming both, rather than pick one."""

from __future__ import annotations

from slurmrl.errors import UserError

# level -> variable -> value (``info``: every program's own default, nothing exported)
LEVELS: dict[str, dict[str, str]] = {
    "debug": {"VLLM_LOGGING_LEVEL": "DEBUG", "DYN_LOG": "debug", "NCCL_DEBUG": "INFO",
              "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_CPP_LOG_LEVEL": "INFO"},
    "info": {},
    "warning": {"VLLM_LOGGING_LEVEL": "WARNING", "DYN_LOG": "warn", "NCCL_DEBUG": "WARN"},
    "error": {"VLLM_LOGGING_LEVEL": "ERROR", "DYN_LOG": "error", "NCCL_DEBUG": "WARN"},
}


def job_env(level: str, env_maps: list[tuple[str, dict[str, str]]]) -> dict[str, str]:
    """The variables ``level`` exports; UserError where one of ``env_maps`` (field name, map) sets one too."""
    out = LEVELS[level]
    for field, env in env_maps:
        for name in sorted(set(out) & set(env)):
            raise UserError(field, f"sets {name}, which log.level = {level!r} sets to {out[name]!r}: set one of "
                            "them (log.level = 'info' exports nothing)")
    return dict(out)


def env_maps(section, path: str = "") -> list[tuple[str, dict[str, str]]]:
    """Every ``env`` table of the recipe (``env``, ``trainer.env``, ``inference.dynamo.env``, ...), by field."""
    out: list[tuple[str, dict[str, str]]] = []
    for name in type(section).model_fields:
        value = getattr(section, name)
        field = f"{path}.{name}" if path else name
        if name == "env" and isinstance(value, dict):
            out.append((field, value))
        elif hasattr(type(value), "model_fields"):
            out += env_maps(value, field)
    return out
