"""The ``#SBATCH`` lines of each het group."""

from __future__ import annotations

from slurmrl.plan.model import Directive
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.slurm_values import signal_option
from slurmrl.rundir.paths import RunDir


def _directive(option: str, value: object = None, comment: str | None = None) -> Directive:
    return Directive(option=option, value=None if value is None else str(value), comment=comment)


def job_wide(r: Recipe, run_dir: str) -> list[Directive]:
    """The options of the whole job, written in the first component."""
    s = r.slurm
    d = [
        _directive("--job-name", s.job_name or r.name),
        _directive("--output", RunDir(run_dir).batch_log_pattern(), "the batch shell's own log; steps log per attempt"),
        _directive("--open-mode", "append"),
        _directive("--requeue" if s.requeue else "--no-requeue"),
        _directive("--signal", signal_option(s.signal), "warning signal to the batch shell: checkpoint, then requeue"),
    ]
    for opt, val in (("--dependency", s.dependency), ("--mail-user", s.mail_user),
                     ("--mail-type", s.mail_type), ("--comment", s.comment), ("--nodelist", s.nodelist)):
        if val:
            d.append(_directive(opt, val))
    return d


def gpu_request(r: Recipe, gpus_per_node: int) -> list[Directive]:
    """A GPU group's GPUs (``--gres`` or ``--gpus-per-node``, of ``gpu_type``) and node constraint."""
    s = r.slurm
    kind = f"gpu:{s.gpu_type}:" if s.gpu_type else "gpu:"
    if s.gpu_request == "gres":
        d = [_directive("--gres", f"{kind}{gpus_per_node}")]
    else:
        d = [_directive("--gpus-per-node", f"{s.gpu_type}:{gpus_per_node}" if s.gpu_type else gpus_per_node)]
    return d + ([_directive("--constraint", s.constraint)] if s.constraint else [])


def group_directives(
    r: Recipe, index: int, nodes: int, gpus_per_node: int, cpus: int, run_dir: str
) -> tuple[Directive, ...]:
    s = r.slurm
    d: list[Directive] = job_wide(r, run_dir) if index == 0 else []  # job-wide options live in the first component
    gpu_group = gpus_per_node > 0
    partition = s.partition if gpu_group else (s.cpu_partition or s.partition)
    for opt, val in (("--account", s.account), ("--partition", partition), ("--qos", s.qos)):
        if val:
            d.append(_directive(opt, val))
    d += [_directive("--time", s.time), _directive("--nodes", nodes), _directive("--ntasks-per-node", 1),
          _directive("--cpus-per-task", cpus)]
    if gpu_group:
        d += gpu_request(r, gpus_per_node)
    for opt, on, val in (("--mem", s.mem, s.mem), ("--exclusive", s.exclusive and gpu_group, None),
                         ("--exclude", s.exclude, s.exclude)):
        if on:
            d.append(_directive(opt, val))
    if index == 0:
        for extra in s.extra_directives:
            opt, _, val = extra.partition("=")
            d.append(_directive(opt, val or None))
    return tuple(d)
