"""The preflight probe's report: ``RUN_DIR/preflight/<component>.<rank>.json``, written by the probe
inside each task's step (``slurmrl.runtime.steps.probe``) and read by ``slurmrl submit --preflight``
(``slurmrl.app.preflight``) after the job (standard library only: the probe starts without pydantic).

    {"component": "trainer", "rank": 0, "host": "n1", "node": 0, "local": 0,
     "gpus_seen": ["0", "1"], "gpus": ["0"], "gpu_positions": [0], "ports": {"http": 8000},
     "container": {"errors": [], "enroot_lock": true, "rootfs": "...", ...},
     "env": {"SLURM_JOB_ID": "7", ...}, "allocation": {"0": "n[1-2]"}, "errors": [], "fabric": null}

``container`` is what the step sees of its Pyxis + enroot container (``ContainerObservation``:
``slurmrl.runtime.steps.container.observe`` makes it, where each key is explained); ``fabric`` is the
node's NVLink fabric (``NodeFabric``: ``slurmrl.runtime.steps.fabric.node_fabric``; null where the plan asks
for no NVLink domain or the node has no nvidia-smi), read by ``slurmrl.slurm.topology``.

Each key is spelled once, as a field name below: ``to_json`` writes every field in order (a null as
null: nothing is left out), ``from_json`` reads them back and names the file and the key that is
missing or of the wrong type in a one-line ``ContractError`` (``slurmrl.contract.reader``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from slurmrl.contract import job_env
from slurmrl.contract.reader import (
    FLAG,
    TEXT,
    WHOLE,
    ContractError,
    Wrong,
    fields_of,
    kind,
    list_of,
    loads,
    or_null,
    parse,
    spec,
    table_of,
)

JOB_ID = "SLURM_JOB_ID"
# the job's variables a report's ``env`` holds (those set in the step)
REPORTED_ENV = (JOB_ID, "SLURM_NODEID", "SLURM_LOCALID", "SLURM_PROCID", "SLURM_STEP_GPUS", job_env.PORT_BASE,
                job_env.ATTEMPT)


def _mode(value: Any, key: str) -> str:
    if value not in ("ro", "rw"):
        raise Wrong(key, f"must be \"ro\" or \"rw\", got {value!r}")
    return value


def _plain(value: Any) -> Any:
    """A field's value as JSON: tuples as lists, a nested report part as its object."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (ContainerObservation, NodeFabric)):
        return value.to_json()
    return value


def _json(obj) -> dict[str, Any]:
    return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}


@dataclass(frozen=True, kw_only=True)
class ContainerObservation:
    """What a step sees of its container (``slurmrl.runtime.steps.container`` explains each key).
    A look that failed in the step is None here and a line in ``errors``."""

    errors: tuple[str, ...] = field(default=(), metadata=spec(list_of(TEXT)))
    enroot_lock: bool | None = field(default=None, metadata=spec(or_null(FLAG)))  # enroot's /.lock is there
    rootfs: str | None = field(default=None, metadata=spec(or_null(TEXT)))  # the root of the / mount
    rootfs_type: str | None = field(default=None, metadata=spec(or_null(TEXT)))
    mounts: dict[str, str] = field(default_factory=dict, metadata=spec(table_of(_mode)))  # point -> "ro" | "rw"
    readonly_root: bool | None = field(default=None, metadata=spec(or_null(FLAG)))
    cwd: str | None = field(default=None, metadata=spec(or_null(TEXT)))
    uid: int = field(metadata=spec(WHOLE))
    gid: int = field(metadata=spec(WHOLE))
    uid_map: str | None = field(default=None, metadata=spec(or_null(TEXT)))  # first line of /proc/self/uid_map
    job_uid: str | None = field(default=None, metadata=spec(or_null(TEXT)))  # SLURM_JOB_UID
    home: str | None = field(default=None, metadata=spec(or_null(TEXT)))  # HOME
    test_double: str | None = field(default=None, metadata=spec(or_null(TEXT)))  # the Pyxis test double's marker

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, data: Any, source: str) -> ContainerObservation:
        """The observation in ``data`` (decoded JSON) from ``source`` (for the error)."""
        return parse(cls, data, source)


@dataclass(frozen=True, kw_only=True)
class NodeFabric:
    """A node's NVLink fabric: each GPU's Fabric block as ``nvidia-smi -q`` shows it (gpu, state, status,
    clique, cluster_uuid: ``slurmrl.runtime.steps.fabric.GpuFabric``) and the node's domains
    (``ClusterUUID/CliqueId``; ``none`` for a GPU in none); or, where nvidia-smi failed, only ``error``
    (then the file holds only that key)."""

    gpus: tuple[dict[str, str], ...] = ()
    domains: tuple[str, ...] = ()
    error: str | None = None

    def __post_init__(self) -> None:
        if self.error is not None and (self.gpus or self.domains):
            raise ValueError("a node's fabric is either its GPUs and domains or the error of nvidia-smi, not both")

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error}
        return {"gpus": [dict(g) for g in self.gpus], "domains": list(self.domains)}


def _fabric(value: Any, key: str) -> NodeFabric:
    if not isinstance(value, dict):
        raise Wrong(key, f"must be an object, got {kind(value)}")
    if "error" in value:
        return NodeFabric(error=TEXT(value["error"], f"{key}.error"))
    for name in ("gpus", "domains"):
        if name not in value:
            raise Wrong(f"{key}.{name}", "is missing")
    return NodeFabric(gpus=list_of(table_of(TEXT))(value["gpus"], f"{key}.gpus"),
                      domains=list_of(TEXT)(value["domains"], f"{key}.domains"))


@dataclass(frozen=True, kw_only=True)
class ProbeReport:
    """One probe's report: where its task ran and what it saw (see the module's note for each key)."""

    component: str = field(metadata=spec(TEXT))
    rank: int = field(metadata=spec(WHOLE))
    host: str = field(metadata=spec(TEXT))
    node: int = field(metadata=spec(WHOLE))  # the plan's node index within the component's het group
    local: int = field(metadata=spec(WHOLE))  # the plan's task index on that node
    gpus_seen: tuple[str, ...] = field(metadata=spec(list_of(TEXT)))  # CUDA_VISIBLE_DEVICES as the step began
    gpus: tuple[str, ...] = field(metadata=spec(list_of(TEXT)))  # the ids kept at the plan's positions
    gpu_positions: tuple[int, ...] = field(metadata=spec(list_of(WHOLE)))  # the plan's
    ports: dict[str, int] = field(metadata=spec(table_of(WHOLE)))  # purpose -> port bound
    container: ContainerObservation = field(
        metadata=spec(lambda v, key: ContainerObservation(**fields_of(ContainerObservation, v, key))))
    env: dict[str, str] = field(metadata=spec(table_of(TEXT)))  # the job's variables the probe reports
    allocation: dict[str, str] = field(metadata=spec(table_of(TEXT)))  # het group -> node list
    errors: tuple[str, ...] = field(metadata=spec(list_of(TEXT)))
    fabric: NodeFabric | None = field(metadata=spec(or_null(_fabric)))

    @property
    def task(self) -> tuple[str, int]:
        return self.component, self.rank

    @property
    def job_id(self) -> str | None:
        """The Slurm job the probe ran in."""
        return self.env.get(JOB_ID)

    @property
    def port_base(self) -> str | None:
        """The job's PORT_BASE as the step saw it (the plan's, or derived from the job id)."""
        return self.env.get(job_env.PORT_BASE)

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    def dumps(self, indent: int | None = None) -> str:
        return json.dumps(self.to_json(), indent=indent)

    @classmethod
    def from_json(cls, data: Any, source: str) -> ProbeReport:
        """The report in ``data`` (decoded JSON) read from ``source`` (the file, for the error)."""
        return parse(cls, data, source)


def read(path: Path) -> ProbeReport:
    """The report in the file at ``path`` (ContractError naming it, for text that is not JSON too;
    OSError as it comes)."""
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError as e:
        raise ContractError(str(path), None, f"not JSON: {e}") from None
    return ProbeReport.from_json(loads(text, str(path)), str(path))
