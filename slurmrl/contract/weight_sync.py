"""How new weights reach the inference servers after each RL step, as one typed value.

The recipe says it as users write it (``trainer.weight_sync = "nccl"``, ``trainer.weight_sync_timeout``);
the planner turns that into a ``WeightSync`` once (``from_recipe``), and every process gets that value
through one spelling: the ``weight_sync`` table of its settings TOML (``to_dict``/``from_dict``; the
settings models hold the same dataclasses). Nothing outside this module compares a mode's name.

- ``Filesystem()``: the trainer writes safetensors to the run dir; every server reloads them.
- ``Broadcast(backend, timeout_s)``: the trainer sends the weights through vLLM's weight-transfer
  routes (``nccl`` between GPUs, ``ipc`` on a GPU it shares with a server, ``gloo`` without GPUs:
  slurmrl's engine) and marks the step; ``timeout_s`` bounds one sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

Backend = Literal["nccl", "ipc", "gloo"]
BACKENDS: tuple[str, ...] = get_args(Backend)
FILESYSTEM = "filesystem"
MODES = (FILESYSTEM, *BACKENDS)  # the recipe's spellings of trainer.weight_sync


@dataclass(frozen=True)
class Filesystem:
    """Weights through the run dir: each server reloads every published step."""

    mode: Literal["filesystem"] = "filesystem"
    by_broadcast: ClassVar[bool] = False

    def describe(self) -> str:
        return FILESYSTEM


@dataclass(frozen=True)
class Broadcast:
    """Weights sent by the trainer to every server worker through vLLM's weight-transfer routes."""

    backend: Backend
    timeout_s: int
    mode: Literal["broadcast"] = "broadcast"
    by_broadcast: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"weight sync backend {self.backend!r}: one of {', '.join(BACKENDS)}")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int) or self.timeout_s < 1:
            raise ValueError(f"weight sync timeout_s {self.timeout_s!r}: a whole number of seconds, at least 1")

    @property
    def between_gpus(self) -> bool:
        """NCCL: trainer and servers on different GPUs."""
        return self.backend == "nccl"

    @property
    def on_shared_gpu(self) -> bool:
        """CUDA IPC: the trainer hands over GPU memory on a GPU it shares with the server."""
        return self.backend == "ipc"

    @property
    def ours(self) -> bool:
        """gloo: slurmrl's own engine (registered by its vLLM plugin), no GPU needed."""
        return self.backend == "gloo"

    def describe(self) -> str:
        return self.backend


WeightSync = Filesystem | Broadcast


def from_recipe(mode: str, timeout_s: int) -> WeightSync:
    """``trainer.weight_sync`` and ``trainer.weight_sync_timeout`` as the recipe has them."""
    if mode == FILESYSTEM:
        return Filesystem()
    if mode not in BACKENDS:
        raise ValueError(f"trainer.weight_sync {mode!r}: one of {', '.join(MODES)}")
    return Broadcast(backend=mode, timeout_s=timeout_s)  # type: ignore[arg-type]  # checked: one of BACKENDS


def to_dict(ws: WeightSync) -> dict[str, object]:
    """The one serialized form (a TOML table / JSON object): ``{mode = "filesystem"}`` or
    ``{mode = "broadcast", backend = ..., timeout_s = ...}``."""
    if isinstance(ws, Broadcast):
        return {"mode": ws.mode, "backend": ws.backend, "timeout_s": ws.timeout_s}
    return {"mode": ws.mode}


def from_dict(data: dict) -> WeightSync:
    """``to_dict``'s output back; a ValueError names what is wrong."""
    mode = data.get("mode")
    if mode == FILESYSTEM and set(data) == {"mode"}:
        return Filesystem()
    if mode == "broadcast" and set(data) == {"mode", "backend", "timeout_s"}:
        return Broadcast(backend=data["backend"], timeout_s=data["timeout_s"])
    raise ValueError(f"weight_sync {data!r}: {{mode = 'filesystem'}} or {{mode = 'broadcast', backend, timeout_s}}")
