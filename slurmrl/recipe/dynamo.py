"""[inference.dynamo]: NVIDIA Dynamo's services and workers."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from slurmrl.recipe.fields import EnvMap
from slurmrl.settings.section import PathText, Section


class Dynamo(Section):
    """NVIDIA Dynamo in place of vLLM servers + vllm-router (`inference.backend = "dynamo"`): etcd (and NATS
    when a plane needs it) and Dynamo's OpenAI frontend on the first inference node, workers of one engine."""

    engine: Literal["vllm", "trtllm", "mocker"] = Field(
        "vllm",
        description="Worker: `python -m dynamo.vllm`, `dynamo.trtllm` (one MPI rank per GPU through "
        "`srun --mpi=pmix` and `trtllm-llmapi-launch`; a worker of `tp` GPUs may then span tp / GPUs-per-node "
        "nodes), or `dynamo.mocker` (Dynamo's simulated engine: no GPU work, for tests and dry runs).",
    )
    engine_config: PathText | None = Field(
        None,
        description="`trtllm`: engine-config YAML for the workers (`--extra-engine-args`; its parallel sizes "
        "must match `tp`). Mode `pd`: the default of both roles.",
    )
    prefill_engine_config: PathText | None = Field(None, description="`trtllm`, mode `pd`: the prefill workers' YAML.")
    decode_engine_config: PathText | None = Field(None, description="`trtllm`, mode `pd`: the decode workers' YAML.")
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
