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
missing or of the wrong type in a one-line ``ReportError``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from slurmrl.contract import env as job_env

Reader = Callable[[Any, str], Any]
JOB_ID = "SLURM_JOB_ID"
# the job's variables a report's ``env`` holds (those set in the step)
REPORTED_ENV = (JOB_ID, "SLURM_NODEID", "SLURM_LOCALID", "SLURM_PROCID", "SLURM_STEP_GPUS", job_env.PORT_BASE,
                job_env.ATTEMPT)


class ReportError(ValueError):
    """A probe report that breaks the contract: one line naming the file and the key."""


class _Bad(Exception):
    def __init__(self, key: str, what: str):
        super().__init__(key, what)
        self.key, self.what = key, what


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _exactly(kind: type, words: str) -> Reader:
    """A JSON scalar of exactly ``kind`` (a boolean is not a whole number, nor the other way round)."""
    def read(value: Any, key: str) -> Any:
        if type(value) is not kind:
            raise _Bad(key, f"must be {words}, got {_kind(value)}")
        return value
    return read


_TEXT, _WHOLE, _FLAG = _exactly(str, "a string"), _exactly(int, "a whole number"), _exactly(bool, "true or false")


def _or_null(read: Reader) -> Reader:
    return lambda value, key: None if value is None else read(value, key)


def _list(item: Reader) -> Reader:
    def read(value: Any, key: str) -> tuple:
        if not isinstance(value, (list, tuple)):
            raise _Bad(key, f"must be a list, got {_kind(value)}")
        return tuple(item(x, f"{key}[{i}]") for i, x in enumerate(value))
    return read


def _table(item: Reader) -> Reader:
    def read(value: Any, key: str) -> dict:
        if not isinstance(value, dict):
            raise _Bad(key, f"must be an object, got {_kind(value)}")
        return {k: item(v, f"{key}.{k}") for k, v in value.items()}
    return read


def _mode(value: Any, key: str) -> str:
    if value not in ("ro", "rw"):
        raise _Bad(key, f"must be \"ro\" or \"rw\", got {value!r}")
    return value


def _spec(read: Reader) -> dict:
    return {"read": read}


def _fields_of(cls, data: Any, where: str) -> dict[str, Any]:
    """``cls``'s fields from the JSON object ``data``: every key must be there (its value may be null
    only where the field's reader allows it)."""
    if not isinstance(data, dict):
        raise _Bad(where or "(top)", f"must be an object, got {_kind(data)}")
    values = {}
    for f in fields(cls):
        key = f"{where}.{f.name}" if where else f.name
        if f.name not in data:
            raise _Bad(key, "is missing")
        values[f.name] = f.metadata["read"](data[f.name], key)
    return values


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

    errors: tuple[str, ...] = field(default=(), metadata=_spec(_list(_TEXT)))
    enroot_lock: bool | None = field(default=None, metadata=_spec(_or_null(_FLAG)))  # enroot's /.lock is there
    rootfs: str | None = field(default=None, metadata=_spec(_or_null(_TEXT)))  # the root of the / mount
    rootfs_type: str | None = field(default=None, metadata=_spec(_or_null(_TEXT)))
    mounts: dict[str, str] = field(default_factory=dict, metadata=_spec(_table(_mode)))  # point -> "ro" | "rw"
    readonly_root: bool | None = field(default=None, metadata=_spec(_or_null(_FLAG)))
    cwd: str | None = field(default=None, metadata=_spec(_or_null(_TEXT)))
    uid: int = field(metadata=_spec(_WHOLE))
    gid: int = field(metadata=_spec(_WHOLE))
    uid_map: str | None = field(default=None, metadata=_spec(_or_null(_TEXT)))  # first line of /proc/self/uid_map
    job_uid: str | None = field(default=None, metadata=_spec(_or_null(_TEXT)))  # SLURM_JOB_UID
    home: str | None = field(default=None, metadata=_spec(_or_null(_TEXT)))  # HOME
    test_double: str | None = field(default=None, metadata=_spec(_or_null(_TEXT)))  # the Pyxis test double's marker

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, data: Any, source: str) -> ContainerObservation:
        """The observation in ``data`` (decoded JSON) from ``source`` (for the error)."""
        return _from(cls, data, source)


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
        raise _Bad(key, f"must be an object, got {_kind(value)}")
    if "error" in value:
        return NodeFabric(error=_TEXT(value["error"], f"{key}.error"))
    for name in ("gpus", "domains"):
        if name not in value:
            raise _Bad(f"{key}.{name}", "is missing")
    return NodeFabric(gpus=_list(_table(_TEXT))(value["gpus"], f"{key}.gpus"),
                      domains=_list(_TEXT)(value["domains"], f"{key}.domains"))


@dataclass(frozen=True, kw_only=True)
class ProbeReport:
    """One probe's report: where its task ran and what it saw (see the module's note for each key)."""

    component: str = field(metadata=_spec(_TEXT))
    rank: int = field(metadata=_spec(_WHOLE))
    host: str = field(metadata=_spec(_TEXT))
    node: int = field(metadata=_spec(_WHOLE))  # the plan's node index within the component's het group
    local: int = field(metadata=_spec(_WHOLE))  # the plan's task index on that node
    gpus_seen: tuple[str, ...] = field(metadata=_spec(_list(_TEXT)))  # CUDA_VISIBLE_DEVICES as the step began
    gpus: tuple[str, ...] = field(metadata=_spec(_list(_TEXT)))  # the ids kept at the plan's positions
    gpu_positions: tuple[int, ...] = field(metadata=_spec(_list(_WHOLE)))  # the plan's
    ports: dict[str, int] = field(metadata=_spec(_table(_WHOLE)))  # purpose -> port bound
    container: ContainerObservation = field(
        metadata=_spec(lambda v, key: ContainerObservation(**_fields_of(ContainerObservation, v, key))))
    env: dict[str, str] = field(metadata=_spec(_table(_TEXT)))  # the job's variables the probe reports
    allocation: dict[str, str] = field(metadata=_spec(_table(_TEXT)))  # het group -> node list
    errors: tuple[str, ...] = field(metadata=_spec(_list(_TEXT)))
    fabric: NodeFabric | None = field(metadata=_spec(_or_null(_fabric)))

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
        return _from(cls, data, source)


def _from(cls, data: Any, source: str):
    try:
        return cls(**_fields_of(cls, data, ""))
    except _Bad as e:
        raise ReportError(f"{source}: key {e.key!r} {e.what}") from None


def read(path: Path) -> ProbeReport:
    """The report in the file at ``path`` (ReportError naming it, for text that is not JSON too;
    OSError as it comes)."""
    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ReportError(f"{path}: not JSON: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return ProbeReport.from_json(data, str(path))
