"""[model] (and [judge.model]): the model the servers and the trainer load."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from slurmrl.settings.limits import MAX_TOKENS
from slurmrl.settings.section import PathText, Section


class Model(Section):
    path: PathText = Field(description="Hugging Face id or a directory with the model.")
    served_name: Annotated[str, Field(min_length=1)] | None = Field(None, description="Name the OpenAI API serves; defaults to `path`.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="Weights dtype.")
    max_model_len: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = Field(
        None, description=f"Context length for inference (1-{MAX_TOKENS} tokens)."
    )
    trust_remote_code: bool = Field(False, description="Allow model code from the checkpoint.")
    stage: Literal["shared", "node-local"] = Field(
        "shared", description="`node-local`: before the servers start, copy `path` (a directory) once per node into "
        "`stage_dir` (one task per node, a lock, sha256 checked); the servers read that copy.",
    )
    stage_dir: PathText = Field(
        "/tmp/slurmrl-models", description="`stage = \"node-local\"`: the node-local folder the copies go to "
        "(one folder per node name inside it).",
    )

    @property
    def served_model_name(self) -> str:
        """The name the OpenAI API serves (``served_name``, else ``path``)."""
        return self.served_name or self.path
