"""What a step program that starts without pydantic (the preflight probe, the step wrappers) reads of
the planner's files, as frozen types: the layout part of ``RUN_DIR/plan.json`` (``slurmrl.plan.model.Plan``
writes it) and the few fields of ``components/<role>.toml`` (``slurmrl.settings``) the probe checks.

Each ``from_json`` takes the decoded file (JSON or TOML), ignores what it does not read, and raises the
kit's ``ContractError`` (``slurmrl.contract.reader``) naming the file and the key that is missing or of
the wrong type. ``tests/test_contract_views.py``
reads the planner's own output for every gallery recipe with these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurmrl.contract.reader import TEXT, TOP, Wrong, child, kind, list_of

_WORDS = {int: "a whole number", str: "a string", bool: "true or false", list: "a list", dict: "a table"}


def _get(data: Any, key: str, of: type, where: str, default: Any = ...) -> Any:
    if not isinstance(data, dict):
        raise Wrong(where or TOP, f"must be a table, got {kind(data)}")
    here = child(where, key)
    if key not in data or data[key] is None:
        if default is not ...:
            return default
        raise Wrong(here, "is missing")
    value = data[key]
    if not isinstance(value, of) or (of is int and isinstance(value, bool)):
        raise Wrong(here, f"must be {_WORDS[of]}, got {kind(value)}")
    return value


def _read(source: str, read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Wrong as e:
        raise e.at(source) from None


@dataclass(frozen=True)
class InstanceView:
    """One task of a component: where it lands and the port-table names it listens on."""

    rank: int
    node: int  # node index within the component's het group
    local: int  # task index on that node
    gpus: tuple[int, ...]  # GPU positions on the node
    ports: dict[str, str]  # purpose -> port-table name

    @classmethod
    def from_json(cls, data: Any, where: str) -> InstanceView:
        return cls(_get(data, "rank", int, where), _get(data, "node", int, where), _get(data, "local", int, where),
                   tuple(_get(data, "gpus", list, where, [])), dict(_get(data, "ports", dict, where, {})))


@dataclass(frozen=True)
class ComponentView:
    name: str
    group: int
    first_node: int  # relative node index within the het group
    main: bool
    instances: tuple[InstanceView, ...]

    @classmethod
    def from_json(cls, data: Any, where: str) -> ComponentView:
        name = _get(data, "name", str, where)
        here = f"{where}[{name}]"
        return cls(name, _get(data, "group", int, here), _get(data, "first_node", int, here),
                   _get(data, "main", bool, here, False),
                   tuple(InstanceView.from_json(x, f"{here}.instances[{i}]")
                         for i, x in enumerate(_get(data, "instances", list, here))))

    def instance_at(self, node: int, local: int) -> InstanceView | None:
        return next((i for i in self.instances if (i.node, i.local) == (node, local)), None)


@dataclass(frozen=True)
class PlanView:
    """plan.json's layout: every component's tasks, and the groups that must share one NVLink domain."""

    components: tuple[ComponentView, ...]
    nvlink_domain: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, data: Any, source: str = "the plan") -> PlanView:
        return _read(source, lambda: cls(
            tuple(ComponentView.from_json(c, "components") for c in _get(data, "components", list, "")),
            tuple(_get(data, "nvlink_domain", list, "", []))))

    def component(self, name: str) -> ComponentView | None:
        return next((c for c in self.components if c.name == name), None)

    @property
    def tasks(self) -> int:
        return sum(len(c.instances) for c in self.components)


@dataclass(frozen=True)
class EnvironmentView:
    """An environment as the settings name it: ``envs.load(name, args)``."""

    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class OrchestratorView:
    """What the probe loads of orchestrator.toml: the environment, whether rewards go through a judge,
    and [eval]'s own environment when it names one (None for the held-out split of the training one)."""

    environment: EnvironmentView
    judge: bool
    eval_environment: EnvironmentView | None
    chat_only_set: tuple[str, ...] = ()  # chat-only fields the recipe set (refused on a text environment)

    @classmethod
    def from_json(cls, data: Any, source: str = "orchestrator.toml") -> OrchestratorView:
        return _read(source, lambda: cls._of(data))

    @classmethod
    def _of(cls, data: Any) -> OrchestratorView:
        env = EnvironmentView(_get(data, "environment", str, ""), dict(_get(data, "environment_args", dict, "", {})))
        ev = _get(data, "eval", dict, "", {})
        own = None
        if ev and not _get(ev, "heldout", bool, "eval", True):
            own = EnvironmentView(_get(ev, "environment", str, "eval"),
                                  dict(_get(ev, "environment_args", dict, "eval", {})))
        chat_only = list_of(TEXT)(_get(data, "chat_only_set", list, "", []), "chat_only_set")
        return cls(env, _get(data, "judge", dict, "", None) is not None, own, chat_only)


@dataclass(frozen=True)
class TrainerView:
    """What the probe checks of trainer.toml: the kind and, for SFT, the dataset."""

    kind: str
    dataset: str | None

    @classmethod
    def from_json(cls, data: Any, source: str = "trainer.toml") -> TrainerView:
        return _read(source, lambda: cls(_get(data, "kind", str, ""), _get(data, "dataset", str, "", None) or None))
