"""What a job script asks for, read from its ``#SBATCH`` lines (the script is the truth: it may
have been edited by hand after rendering)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from slurmrl.errors import UserError
from slurmrl.rundir.paths import RunDir

SHORT = {"-N": "--nodes", "-p": "--partition", "-c": "--cpus-per-task", "-J": "--job-name",
         "-G": "--gpus", "-n": "--ntasks", "-t": "--time", "-o": "--output"}
WITH_VALUE = set(SHORT.values()) | {"--gpus-per-node", "--gres", "--ntasks-per-node", "--mem", "--signal",
                                    "--open-mode", "--account", "--qos", "--constraint", "--exclude",
                                    "--nodelist", "--reservation", "--mem-per-cpu", "--mem-per-gpu"}


@dataclass
class GroupRequest:
    """One het group (or the whole job when there is one group) as the script asks for it."""

    index: int
    options: dict[str, str] = field(default_factory=dict)  # long option -> value ("" for flags)

    @property
    def partition(self) -> str | None:
        return self.options.get("--partition")

    @property
    def nodes(self) -> int:
        return _count(self.options.get("--nodes", "1").split("-")[0], "--nodes", 1)

    @property
    def gpus_per_node(self) -> int:
        if "--gpus-per-node" in self.options:
            return _count(self.options["--gpus-per-node"].split(":")[-1], "--gpus-per-node", 0)
        total = 0
        for gres in self.options.get("--gres", "").split(","):
            parts = gres.split(":")
            if parts[0] == "gpu":
                total += _count(parts[-1], "--gres", 1) if len(parts) > 1 else 1
        return total

    @property
    def cpus_per_node(self) -> int:
        per_task = _count(self.options.get("--cpus-per-task", "1"), "--cpus-per-task", 1)
        tasks = _count(self.options.get("--ntasks-per-node", "1"), "--ntasks-per-node", 1)
        return per_task * tasks


def _count(text: str, option: str, default: int) -> int:
    m = re.match(r"\d+", text.strip())
    if not m:
        if text.strip() == "":
            return default
        raise UserError(option, f"cannot read a count from {text!r} in the job script")
    return int(m.group())


def read_groups(text: str, where: str = RunDir.SCRIPT) -> list[GroupRequest]:
    """``#SBATCH`` options per het group. sbatch stops reading them at the first command line."""
    groups = [GroupRequest(0)]
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if n == 1 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            break
        if not stripped.startswith("#SBATCH"):
            continue
        try:
            words = shlex.split(stripped[len("#SBATCH"):], comments=True)
        except ValueError as e:
            raise UserError(f"{where}:{n}", f"cannot read this #SBATCH line: {e}") from None
        if words in (["hetjob"], ["packjob"]):
            groups.append(GroupRequest(len(groups)))
            continue
        i = 0
        while i < len(words):
            word = words[i]
            opt, eq, value = word.partition("=")
            if not eq and len(opt) > 2 and opt[:2] in SHORT and not opt.startswith("--"):
                opt, value, eq = opt[:2], opt[2:], "="  # -N2
            opt = SHORT.get(opt, opt)
            if not eq and opt in WITH_VALUE and i + 1 < len(words):
                value = words[i + 1]
                i += 1
            groups[-1].options[opt] = value
            i += 1
    return groups
