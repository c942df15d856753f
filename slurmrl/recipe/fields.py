"""Field types more than one recipe section uses: environment maps, single-line lists, names."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated

from pydantic import AfterValidator, BaseModel

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


EnvMap = Annotated[dict[str, str], AfterValidator(_check_env)]

MAX_FAIL_ON = 64


def _check_patterns(values: list[str]) -> list[str]:
    if len(values) > MAX_FAIL_ON:
        raise ValueError(f"at most {MAX_FAIL_ON} patterns")
    for v in _check_single_line(values, "failure patterns"):
        try:
            compiled = re.compile(v)
        except re.error as e:
            raise ValueError(f"{v!r} is not a regular expression (Python's re): {e}") from None
        if compiled.search("") is not None:
            raise ValueError(f"{v!r} matches an empty line, so every line of the log")
    return values


# Failure probes of one component (slurmrl.runtime.steps.probes): a log line matching one ends the job.
FailOn = Annotated[list[str], AfterValidator(_check_patterns)]
FAIL_ON_HELP = ("Failure probes: regular expressions (Python's `re`); a line of {what}'s log that matches one "
                "ends the job at once, the line quoted in FAILED and `status` (CUDA out of memory, NCCL errors and "
                "a missing model are probed always).")


# ---- no blank value reaches a script ---------------------------------------------------------------
def blank_fields(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(field path, what is wrong) for every blank value in ``model`` and the sections under it: a string
    of only whitespace (an empty string is "left out" where a field allows it), and an empty or
    whitespace-only item of a list (a word of a command line, a module, a node, a served name).
    Maps are data (environment values, environment arguments): their values are the user's to choose."""
    for name in type(model).model_fields:
        value, path = getattr(model, name), f"{prefix}{name}"
        if isinstance(value, str):
            if value and not value.strip():
                yield path, "is blank (only whitespace); give a value or leave the field out"
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, str) and not item.strip():
                    yield path, f"item {i + 1} is {'empty' if not item else 'blank (only whitespace)'}; remove it"
                elif isinstance(item, BaseModel):
                    yield from blank_fields(item, f"{path}[{i}].")
        elif isinstance(value, BaseModel):
            yield from blank_fields(value, f"{path}.")
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, BaseModel):
                    yield from blank_fields(item, f"{path}.{key}.")
