"""How workers of tp x dp GPUs sit on nodes: the one place this arithmetic lives.

vLLM's servers, Dynamo's workers and the judge's servers all ask the same questions: how many
nodes one worker spans, how many workers (tasks) a node holds, which GPUs each task takes, how
replicas spread over nodes. Every refusal names the recipe field it comes from
(``Parallelism.field``) and says what to change.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from slurmrl.errors import UserError


@dataclass(frozen=True)
class Parallelism:
    """One engine's worker size, as its recipe section gives it."""

    field: str  # the recipe section its tp/dp/nodes live in, e.g. "inference.prefill"
    tp: int
    dp: int = 1
    by_tp: bool = False  # the engine sizes workers by tp alone (Dynamo, the judge): refusals name tp

    @property
    def size(self) -> int:
        """GPUs per worker."""
        return self.tp * self.dp

    def product(self) -> str:
        """The worker's size as a refusal names it."""
        return f"tp={self.tp}" if self.by_tp else f"tp x dp = {self.size}"

    def worker(self) -> str:
        return f"tp={self.tp}" if self.by_tp else f"tp x dp = {self.size} GPUs"


@dataclass(frozen=True)
class Slice:
    """Where one component's workers go on each of its nodes."""

    span: int  # nodes per worker
    per_node: int  # tasks per node: workers per node, or 1 when a worker spans nodes
    gpus: int  # GPUs per task

    @property
    def gpus_per_node(self) -> int:
        return self.per_node * self.gpus

    def task_gpus(self, positions: tuple[int, ...], local: int) -> tuple[int, ...]:
        """The GPU positions task ``local`` of a node takes from the component's ``positions``."""
        return positions[local * self.gpus:(local + 1) * self.gpus]

    def tasks(self, positions: tuple[int, ...], nodes: int) -> Iterator[tuple[int, int, tuple[int, ...]]]:
        """(node, local, GPU positions) of every task of a component over ``nodes`` nodes, in rank order."""
        for node in range(nodes):
            for local in range(self.per_node):
                yield node, local, self.task_gpus(positions, local)

    def leads(self, node: int) -> bool:
        """``node`` is a worker's first node (the one that serves its API)."""
        return node % self.span == 0

    def worker_at(self, worker: int) -> tuple[int, int]:
        """(first node, local index) of worker number ``worker``: a node's workers fill it first."""
        return worker // self.per_node * self.span, worker % self.per_node


def worker_span(p: Parallelism, gpn: int, span: int | None = None, tp_spans: bool = False,
                one_node: str = "") -> tuple[int, int]:
    """(nodes per worker, GPUs per node of a worker) for one worker on nodes of ``gpn`` GPUs: one
    node when it fits, else whole nodes (or ``span`` nodes when the recipe gives it).
    ``tp_spans``: a tensor-parallel group may span nodes (TRT-LLM over MPI); else a refusal, with
    ``one_node`` saying why."""
    size = p.size
    if p.tp > gpn and not tp_spans:
        raise UserError(f"{p.field}.tp", f"tp={p.tp} needs more than the {gpn} GPUs of one node{one_node}")
    if span is None:
        if size <= gpn:
            return 1, size
        if size % gpn:
            fix = "use a multiple of" if p.by_tp else "make tp x dp a multiple of"
            raise UserError(f"{p.field}.{'tp' if p.by_tp else 'dp'}",
                            f"a worker of {p.worker()} spans whole nodes of {gpn} GPUs; {fix} {gpn}")
        return size // gpn, gpn
    if size % span or (size // span) % p.tp or size // span > gpn:
        raise UserError(
            f"{p.field}.nodes_per_worker",
            f"{span} nodes cannot hold a worker of tp x dp = {size} GPUs evenly (whole engines of tp={p.tp}, "
            f"at most {gpn} GPUs per node)",
        )
    return span, size // span


def per_node(p: Parallelism, gpus: int, of: str | None = None) -> int:
    """Workers of one node when each fits on it: ``gpus`` (the node's GPUs for this engine) must be
    whole workers. ``of``: how the refusal names those GPUs (default: the inference GPUs)."""
    if gpus % p.size:
        raise UserError(f"{p.field}.tp", f"{p.product()} does not divide {of or f'the {gpus} inference GPUs'} per node")
    return gpus // p.size


def whole_workers(p: Parallelism, nodes: int, span: int) -> None:
    """``nodes`` hold whole workers of ``span`` nodes each."""
    if nodes % span:
        raise UserError(f"{p.field}.nodes", f"{nodes} nodes do not hold whole workers of {span} nodes "
                        f"({p.worker()}); use a multiple of {span}")


def spread(p: Parallelism, replicas: int, span: int, per: int, gpn: int, nodes: int | None = None,
           first_gpu: int = 0, left: str = "") -> tuple[int, int]:
    """(nodes, GPUs used per node) for ``replicas`` workers of ``per`` GPUs per node over ``span``
    nodes each, on nodes with ``gpn`` GPUs from ``first_gpu`` on; ``nodes``: the recipe's count
    (else as few as hold them). ``left``: why fewer GPUs than ``gpn`` are free, for the refusal."""
    if span > 1:
        want = replicas * span
        nodes = nodes or want
        if nodes != want:
            raise UserError(f"{p.field}.nodes", f"{replicas} workers x {span} nodes each need {want} nodes, not {nodes}")
        return nodes, per
    nodes = nodes or math.ceil(replicas * per / gpn)
    if replicas % nodes:
        raise UserError(f"{p.field}.replicas", f"{replicas} workers do not spread evenly over {nodes} nodes; "
                        f"use a multiple of {nodes}")
    used = replicas // nodes * per
    if used > gpn - first_gpu:
        worker = f"tp={p.tp}" if p.by_tp else f"{per} GPUs"
        raise UserError(f"{p.field}.nodes", f"{replicas // nodes} workers x {worker} per node need {used} GPUs; "
                        f"nodes have {gpn}{left}")
    return nodes, used
