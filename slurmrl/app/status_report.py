"""`slurmrl status`'s report of a job, typed (TorchX's ``DescribeAppResponse`` is the model): the job's
state and het parts as Slurm tells them, and what the run dir adds (the attempt, each plan component's
step, readiness, dead tasks and restarts, where the job serves, the phases, the latest training row, the
benchmark, the events). ``status_read.report`` builds it, the table (``status_text``), ``--json``
(``to_json``) and ``--watch`` read it; nothing indexes it by string. ``to_json`` writes the keys
`status --json` always had, in their order."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from slurmrl.contract.bench_summary import BenchSummary
from slurmrl.contract.events import Event
from slurmrl.slurm.watch import Part, Snapshot, Step


@dataclass
class PartStatus:
    """One het part of the job (Slurm's), named after its plan group."""

    part: Part
    name: str = ""

    def to_json(self) -> dict:
        return {**asdict(self.part), "name": self.name}


@dataclass
class DeadTask:
    task: int
    code: int | None
    cause: str


@dataclass
class ComponentStatus:
    """One plan component in the shown attempt: its step, the tasks ready and dead, its restarts, and
    whether a planned stop ended it (the script's teardown, or every task asked to stop)."""

    name: str
    group: int
    main: bool = False
    critical: bool = True
    instances: int = 1
    step: Step | None = None
    ready: list[int] = field(default_factory=list)
    dead: list[DeadTask] = field(default_factory=list)
    torn_down: bool = False
    stopped: bool = False
    restarts: int = 0

    def to_json(self) -> dict:
        step = None if self.step is None else {"id": self.step.id, "state": self.step.state,
                                               "exit_code": self.step.exit_code, "elapsed": self.step.elapsed,
                                               "nodes": self.step.nodes}
        return {"torn_down": self.torn_down, "stopped": self.stopped, "name": self.name, "group": self.group,
                "main": self.main, "critical": self.critical, "instances": self.instances, "step": step,
                "ready": list(self.ready), "dead": [asdict(d) for d in self.dead], "restarts": self.restarts}


@dataclass
class Endpoint:
    component: str
    task: int
    url: str


@dataclass
class Serving:
    """Where clients talk to the job: the router's URL when the plan has one, else each server's (``url``
    is the first; None while none is ready); ``components``: the ones that serve."""

    url: str | None = None
    urls: list[str] = field(default_factory=list)
    components: list[str] = field(default_factory=list)
    router: bool = False


@dataclass
class Phase:
    time: float
    since_allocation: float
    what: str


@dataclass
class ReportPage:
    """Where `slurmrl report` writes the run's page, and whether it is there yet."""

    page: str
    exists: bool


@dataclass
class StatusReport:
    snapshot: Snapshot
    run_dir: str | None = None
    parts: list[PartStatus] = field(default_factory=list)
    attempt: int | None = None
    attempt_waiting: bool = False
    max_requeues: int | None = None
    requeues_used: int | None = None
    components: list[ComponentStatus] = field(default_factory=list)
    failed: str | None = None
    stopped: str | None = None
    endpoints: list[Endpoint] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    serving: Serving | None = None
    model: str | None = None
    secret_file: str | None = None
    phases: list[Phase] = field(default_factory=list)
    links: dict = field(default_factory=dict)
    benchmark: BenchSummary | None = None
    training: dict | None = None  # role -> its newest metrics row (orchestrator, trainer, eval)
    report: ReportPage | None = None
    cluster: str | None = None  # --cluster: the cluster's name (a run dir's report only)
    joiners: list[dict] | None = None  # servers of other jobs that joined (slurmrl.app.status_joiners)
    attempt_ends: list[dict] | None = None  # why each attempt ended (slurmrl.app.status_nodes)
    excluded: dict[str, dict] | None = None  # nodes kept out

    @property
    def job_id(self) -> str:
        return self.snapshot.job_id

    @property
    def state(self) -> str:
        return self.snapshot.state

    @property
    def serving_url(self) -> str | None:
        return self.serving.url if self.serving else None

    def finished(self) -> bool:
        """The run truly finished: Slurm says COMPLETED and its last attempt neither failed nor stopped early."""
        return self.state == "COMPLETED" and not self.failed and not self.stopped

    def to_json(self) -> dict[str, Any]:
        snap = self.snapshot.to_dict()
        out: dict[str, Any] = {"job_id": self.job_id, "run_dir": self.run_dir, **snap,
                               "parts": [p.to_json() for p in self.parts]}
        out.update(attempt=self.attempt, attempt_waiting=self.attempt_waiting, max_requeues=self.max_requeues,
                   requeues_used=self.requeues_used, components=[c.to_json() for c in self.components],
                   failed=self.failed, stopped=self.stopped, endpoints=[asdict(e) for e in self.endpoints],
                   events=[asdict(e) for e in self.events], serving_url=self.serving_url,
                   serving=asdict(self.serving) if self.serving else None, model=self.model,
                   secret_file=self.secret_file, phases=[asdict(p) for p in self.phases], links=self.links,
                   benchmark=self.benchmark.to_json() if self.benchmark else None, training=self.training,
                   report=asdict(self.report) if self.report else None)
        if self.run_dir is not None:
            out.update(cluster=self.cluster, joiners=self.joiners or [], attempt_ends=self.attempt_ends or [],
                       excluded=self.excluded or {})
        return out
