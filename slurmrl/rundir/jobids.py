"""Slurm job ids as Slurm prints them, checked wherever one is read back or handed to a Slurm command.

A job id read from a run dir (jobs.json, allocations, links, sweep.json, lock.toml) is input: one
that looked like an option (``-1``, ``--me``) would make ``scancel`` cancel far more than the
run's own job. Accepted, as ``squeue``/``sacct``/``sbatch --parsable`` print them:

- ``123``: a job; ``123_4``, ``123_[1-3,5]``, ``123_[1-3%2]``: array tasks; ``123+1``: a het component;
- ``123.batch``, ``123.4``, ``123+1.0``: steps (for ``sacct``/``scontrol``/``srun --jobid``);
- ``123;cluster``: ``sbatch --parsable`` on a multi-cluster setup (the id is the part before ``;``
  in what we record; the form is refused here).
"""

from __future__ import annotations

import re

from slurmrl.errors import UserError

_ARRAY = r"(?:_(?:\d+|\[\d+(?:-\d+)?(?::\d+)?(?:,\d+(?:-\d+)?(?::\d+)?)*(?:%\d+)?\]))"
_JOB = rf"[1-9]\d{{0,11}}(?:{_ARRAY}|\+\d{{1,4}})?"
_STEP = r"(?:\.(?:\d{1,10}|batch|extern|interactive))?"
JOB_ID = re.compile(rf"{_JOB}", re.ASCII)
JOB_OR_STEP = re.compile(rf"{_JOB}{_STEP}", re.ASCII)


def is_job_id(value: object, steps: bool = False) -> bool:
    return isinstance(value, str) and (JOB_OR_STEP if steps else JOB_ID).fullmatch(value) is not None


def check_job_id(value: object, where: str, steps: bool = False) -> str:
    """``value`` as a job id, else a one-line error naming ``where`` (a file, or a command)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not is_job_id(value, steps):
        shown = repr(value)[:60]
        raise UserError(where, f"{shown} is not a Slurm job id (digits, with _N, _[..] or +N for array and "
                               "het jobs)")
    return value  # type: ignore[return-value]


def split_ids(value: str) -> list[str]:
    """``1,2_[3,4],5`` -> ``[1, 2_[3,4], 5]``: commas inside an array's brackets stay."""
    out, depth, word = [], 0, ""
    for c in value:
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            out.append(word)
            word = ""
        else:
            word += c
    return out + [word]


ID_OPTIONS = ("-j", "--jobs", "--job", "--jobid")  # squeue/sacct/scancel -j, srun --jobid
SCANCEL_OPTIONS = ("--batch", "-b", "--full", "-f", "--quiet", "-Q", "--verbose", "-v", "--hurry", "-H")
SCONTROL_ID_AFTER = ("job", "requeue", "requeuehold", "hold", "release", "suspend", "resume", "notify")


def check_argv(argv: list[str]) -> None:
    """Before a Slurm client command runs: every job id it names is a job id, passed so that it
    cannot be taken as an option: as ``--jobs=ID``/``-j ID``/``--jobid=ID``, after ``--``
    (scancel), or after scontrol's ``job``/``requeue``/... word. scancel takes only a few known
    options before ``--``: a word read from a file can never become ``--me`` or ``--user``."""
    if not argv:
        return
    tool = argv[0].rsplit("/", 1)[-1]
    if tool == "srun":  # attach: srun's own options, then the user's command (not ours to check)
        _check_srun(argv[1:])
        return
    i = 1
    while i < len(argv):
        word = argv[i]
        if "\n" in word or "\r" in word or "\0" in word:
            raise UserError(tool, f"argument {word[:40]!r} holds a line break or NUL")
        if word == "--" and tool in ("scancel", "sbatch"):
            _check_after_dashes(tool, argv[i + 1:])
            return
        i = _check_word(tool, argv, i) + 1


def _ids(tool: str, value: str) -> None:
    """Each job id (or step) of a comma-separated list given to ``tool``."""
    for one in split_ids(value):
        check_job_id(one, tool, steps=True)


def _check_srun(options: list[str]) -> None:
    """srun's options up to the command: a job id only as ``--jobid=ID``."""
    for word in options:
        if not word.startswith("-"):
            return
        name, eq, value = word.partition("=")
        if name == "--jobid" and not eq:
            raise UserError("srun", "pass the job id as --jobid=ID")
        if name == "--jobid":
            _ids("srun", value)


def _check_after_dashes(tool: str, rest: list[str]) -> None:
    """scancel: only job ids after ``--``; sbatch: the script's own arguments follow (not ours)."""
    if tool == "sbatch":
        return
    if not rest:
        raise UserError(tool, "no job id after --")
    for one in rest:
        _ids(tool, one)


def _check_word(tool: str, argv: list[str], i: int) -> int:
    """The word ``argv[i]`` (with the value after it, where it takes one); returns the last index read."""
    word = argv[i]
    name, eq, value = word.partition("=")
    if name in ID_OPTIONS and tool != "sbatch":
        if not eq:
            i += 1
            value = argv[i] if i < len(argv) else ""
        _ids(tool, value)
    elif tool == "scancel":
        if not (word.startswith("--signal=") or word in SCANCEL_OPTIONS):
            raise UserError(tool, f"{word[:40]!r}: pass job ids after -- (or as --jobs=ID)")
    elif tool == "scontrol" and word.lower() in SCONTROL_ID_AFTER and i + 1 < len(argv):
        i += 1
        _ids(tool, argv[i])
    return i
