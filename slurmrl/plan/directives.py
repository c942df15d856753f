"""The ``#SBATCH`` lines of each het group."""

from __future__ import annotations

from slurmrl.plan.model import Directive
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.slurm_values import signal_option
from slurmrl.rundir.paths import RunDir


def group_directives(
    r: Recipe, index: int, nodes: int, gpus_per_node: int, cpus: int, run_dir: str
) -> tuple[Directive, ...]:
    s = r.slurm
    d: list[Directive] = []

    def add(option: str, value: object = None, comment: str | None = None) -> None:
        d.append(Directive(option=option, value=None if value is None else str(value), comment=comment))

    if index == 0:  # job-wide options live in the first component
        add("--job-name", s.job_name or r.name)
        add("--output", RunDir(run_dir).batch_log_pattern(), "the batch shell's own log; steps log per attempt")
        add("--open-mode", "append")
        add("--requeue" if s.requeue else "--no-requeue")
        add("--signal", signal_option(s.signal), "warning signal to the batch shell: checkpoint, then requeue")
        for opt, val in (("--dependency", s.dependency), ("--mail-user", s.mail_user),
                         ("--mail-type", s.mail_type), ("--comment", s.comment), ("--nodelist", s.nodelist)):
            if val:
                add(opt, val)
    gpu_group = gpus_per_node > 0
    partition = s.partition if gpu_group else (s.cpu_partition or s.partition)
    for opt, val in (("--account", s.account), ("--partition", partition), ("--qos", s.qos)):
        if val:
            add(opt, val)
    add("--time", s.time)
    add("--nodes", nodes)
    add("--ntasks-per-node", 1)
    add("--cpus-per-task", cpus)
    if gpu_group:
        kind = f"gpu:{s.gpu_type}:" if s.gpu_type else "gpu:"
        if s.gpu_request == "gres":
            add("--gres", f"{kind}{gpus_per_node}")
        else:
            add("--gpus-per-node", f"{s.gpu_type}:{gpus_per_node}" if s.gpu_type else gpus_per_node)
        if s.constraint:
            add("--constraint", s.constraint)
    if s.mem:
        add("--mem", s.mem)
    if s.exclusive and gpu_group:
        add("--exclusive")
    if s.exclude:
        add("--exclude", s.exclude)
    if index == 0:
        for extra in s.extra_directives:
            opt, _, val = extra.partition("=")
            add(opt, val or None)
    return tuple(d)
