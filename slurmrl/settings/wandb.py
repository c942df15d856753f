"""Run tracking: the ``wandb`` table of ``RUN_DIR/components/trainer.toml`` and ``orchestrator.toml``,
read by ``slurmrl.runtime.tracking``. The recipe's ``[wandb]`` (``slurmrl.recipe.wandb``) extends it.

The trainer and the orchestrator are two W&B runs of one group (by default the run dir's name), named
``<name>-trainer`` and ``<name>-orchestrator``. The API key is never here: W&B reads ``WANDB_API_KEY``
from the job's environment (sbatch passes the submitting shell's; ``--cluster`` forwards it over ssh's
stdin). The metrics files under ``RUN_DIR/metrics/`` stay the record; W&B is a view of them.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from slurmrl.errors import UserError
from slurmrl.settings.section import Section

# W&B refuses these in project names (and a group, an entity or a tag has no use for them either)
_FORBIDDEN = re.compile(r"[/\\#?%:\x00-\x1f\x7f]")
_ENTITY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_KEY_WORDS = ("key", "api_key", "apikey", "token", "secret", "password")


def safe_name(text: str) -> str:
    """A run dir's name as a W&B group or run name (the default of both): what W&B refuses becomes ``_``."""
    return _FORBIDDEN.sub("_", text)[:128].strip() or "run"


def _w_name(what: str, longest: int):
    def check(text: str) -> str:
        if not text.strip():
            raise ValueError(f"is empty{' (only spaces)' if text else ''}; give a {what} or leave the field out")
        if len(text) > longest:
            raise ValueError(f"is {len(text)} characters; W&B takes at most {longest}")
        bad = _FORBIDDEN.search(text)
        if bad:
            raise ValueError(f"contains {bad.group()!r}; W&B {what}s cannot contain / \\ # ? % : or control characters")
        return text
    return AfterValidator(check)


def _entity(text: str) -> str:
    if not _ENTITY.match(text):
        raise ValueError(f"{text!r} is not a W&B user or team name (letters, digits, _ . -; at most 64)")
    return text


def _tags(tags: list[str]) -> list[str]:
    if len(set(tags)) != len(tags):
        raise ValueError("a tag is given twice")
    return tags


Project = Annotated[str, _w_name("project name", 128)]
Group = Annotated[str, _w_name("group name", 128)]
RunName = Annotated[str, _w_name("run name", 128)]
Tag = Annotated[str, _w_name("tag", 64)]


class WandbSettings(Section):
    """Where the trainer's and the orchestrator's W&B runs go (``[wandb]``)."""

    project: Project = Field("slurmrl", description="W&B project (at most 128 characters, none of / \\ # ? % :).")
    entity: Annotated[str, AfterValidator(_entity)] | None = Field(
        None, description="W&B user or team the runs belong to; default: the key's default entity.",
    )
    group: Group | None = Field(
        None,
        description="W&B group of the job's runs (the trainer's and the orchestrator's); default: the run dir's "
        "name, so a requeued or resumed job stays in its group.",
    )
    name: RunName | None = Field(
        None,
        description="Run name; the runs are `<name>-trainer` and `<name>-orchestrator`. Default: the run dir's name.",
    )
    tags: Annotated[list[Tag], AfterValidator(_tags)] = Field(
        default_factory=list, max_length=64, description="W&B tags of both runs (at most 64, each at most 64 characters).",
    )
    mode: Literal["online", "offline", "disabled"] | None = Field(
        None,
        description="`online` (needs WANDB_API_KEY in the environment you submit from, and the nodes reaching W&B), "
        "`offline` (files under RUN_DIR/wandb; `wandb sync` them later) or `disabled`. Default: the job's "
        "WANDB_MODE, else `offline`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_key(cls, data):
        if isinstance(data, dict):
            for k in data:
                if isinstance(k, str) and k.lower() in _KEY_WORDS:
                    raise UserError(f"wandb.{k}", "the W&B key is never written in a recipe; export WANDB_API_KEY in "
                                    "the shell you submit from (sbatch passes it on; `--cluster` forwards it)")
        return data
