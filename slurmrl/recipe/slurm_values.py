"""Slurm's own spellings of the values slurmrl writes on #SBATCH lines: one home per kind of value.

Each check takes every form sbatch(1) documents (Slurm 22.05 and newer) and refuses, with a
ValueError saying why, what sbatch would refuse or what cannot work in a slurmrl job. The recipe's
fields use the ``Annotated`` types below; the planner reads the values back through the helpers
(``time_seconds``, ``signal_name``, ``signal_seconds``, ``signal_option``).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from slurmrl.settings.limits import MAX_DAYS, MAX_SIGNAL_SECONDS

# ---- times: --time, and slurmrl's total budget over requeues --------------------------------------

# sbatch --time: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
# "days-hours:minutes" and "days-hours:minutes:seconds"; 0 (or UNLIMITED / INFINITE) is no limit.
_TIME = re.compile(r"^(?:(\d{1,7})|(\d{1,7}):(\d{1,7})|(\d{1,7}):(\d{1,7}):(\d{1,7})|"
                   r"(\d{1,4})-(\d{1,7})(?::(\d{1,7}))?(?::(\d{1,7}))?)$")
UNLIMITED = ("UNLIMITED", "INFINITE")
TIME_FORMS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def time_seconds(text: str) -> int | None:
    """Seconds in a Slurm time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``);
    None for no limit (``0``, ``UNLIMITED``, ``INFINITE``). ValueError for any other text."""
    if text.upper() in UNLIMITED:
        return None
    m = _TIME.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a Slurm time; use {TIME_FORMS}")
    g = [int(x) if x is not None else 0 for x in m.groups()]
    if m.group(1) is not None:
        seconds = g[0] * 60
    elif m.group(2) is not None:
        seconds = g[1] * 60 + g[2]
    elif m.group(4) is not None:
        seconds = g[3] * 3600 + g[4] * 60 + g[5]
    else:
        seconds = g[6] * 86400 + g[7] * 3600 + g[8] * 60 + g[9]
    return None if seconds == 0 else seconds


def check_time_limit(text: str) -> str:
    """``slurm.time``: a Slurm time of at most MAX_DAYS days, or no limit (0, UNLIMITED, INFINITE)."""
    seconds = time_seconds(text)
    if seconds is not None and seconds > MAX_DAYS * 86400:
        raise ValueError(f"{text!r} is more than {MAX_DAYS} days")
    return text.upper() if text.upper() in UNLIMITED else text


def check_time_budget(text: str) -> str:
    """A finite Slurm time of at most MAX_DAYS days (``slurm.max_total_time``: leave it out for none)."""
    if time_seconds(text) is None:
        raise ValueError(f"{text!r} is no limit; leave the field out for no budget")
    return check_time_limit(text)


TimeLimit = Annotated[str, AfterValidator(check_time_limit)]
TimeBudget = Annotated[str, AfterValidator(check_time_budget)]


def check_switches(text: str) -> str:
    """sbatch's ``--switches=COUNT[@MAX-WAIT]``: 1-9999 leaf switches, waiting at most a Slurm time."""
    count, at, wait = text.partition("@")
    if not (count.isascii() and count.isdigit() and 1 <= int(count) <= 9999) or (at and not wait):
        raise ValueError(f"{text!r} is not COUNT[@MAX-WAIT] (COUNT 1-9999 leaf switches, MAX-WAIT a Slurm time)")
    if at:
        try:
            seconds = time_seconds(wait)
        except ValueError:
            raise ValueError(f"{text!r}: MAX-WAIT {wait!r} is not a Slurm time; use {TIME_FORMS}") from None
        if seconds is not None and seconds > MAX_DAYS * 86400:  # 0: no wait (Slurm's cap: max_switch_wait)
            raise ValueError(f"{text!r}: MAX-WAIT is more than {MAX_DAYS} days")
    return text


Switches = Annotated[str, AfterValidator(check_switches)]

# ---- the warning signal: --signal=[{R|B}:]<sig_num>[@sig_time] -----------------------------------

# The signal names sbatch knows (sig_name2num), with or without SIG, in any case; numbers are Linux's.
SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7, "FPE": 8, "KILL": 9,
           "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15, "STKFLT": 16, "CHLD": 17,
           "CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22, "URG": 23, "XCPU": 24, "XFSZ": 25,
           "VTALRM": 26, "PROF": 27, "WINCH": 28, "IO": 29, "PWR": 30, "SYS": 31}
_NAMES = {n: name for name, n in SIGNALS.items()}
MAX_SIGNAL = 64  # SIGRTMAX on Linux; 32 and 33 are the C library's own
UNUSABLE = {  # signals the script cannot take as its warning, and why
    "KILL": "cannot be caught, so the script could not checkpoint",
    "STOP": "cannot be caught, so the script could not checkpoint",
    "TERM": "is how scancel and the time limit stop the script; pick another (USR1, USR2, ...)",
    "CHLD": "is sent whenever a child process exits; pick another (USR1, USR2, ...)",
}
_SIGNAL = re.compile(r"^(?:([RB]|RB|BR):)?([A-Za-z0-9]+)(?:@(\d+))?$", re.I)
DEFAULT_SIGNAL_SECONDS = 60  # sbatch(1): a sig_num without a sig_time is sent 60 seconds before the end


def check_signal(text: str) -> str:
    """``slurm.signal`` in sbatch's form, normalized to ``[R:]NAME@SECONDS`` (the name as bash's trap
    takes it, the seconds written out). The script always asks for it on the batch shell (``B:``)."""
    m = _SIGNAL.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not [R:|B:]SIGNAL[@SECONDS] as sbatch takes it, e.g. USR1@120")
    flags, sig, seconds = (m.group(1) or "").upper(), m.group(2).upper(), m.group(3)
    if sig.isdigit():
        number = int(sig)
        if not 1 <= number <= MAX_SIGNAL or number in (32, 33):
            raise ValueError(f"{text!r}: {number} is not a signal a program can take (1-31, 34-{MAX_SIGNAL})")
        name = _NAMES.get(number, str(number))
    else:
        name = sig.removeprefix("SIG")
        if name not in SIGNALS:
            raise ValueError(f"{text!r}: {sig} is not a signal name sbatch knows (USR1, USR2, HUP, ...)")
    if name in UNUSABLE:
        raise ValueError(f"{text!r}: SIG{name} {UNUSABLE[name]}")
    digits = (seconds or "").lstrip("0") or "0"  # sbatch reads 0120 as 120
    secs = DEFAULT_SIGNAL_SECONDS if seconds is None else int(digits) if len(digits) <= 6 else MAX_SIGNAL_SECONDS + 1
    if secs > MAX_SIGNAL_SECONDS:
        raise ValueError(f"{text!r}: sbatch takes 0-{MAX_SIGNAL_SECONDS} seconds")
    return f"{'R:' if 'R' in flags else ''}{name}@{secs}"


def signal_name(signal: str) -> str:
    """The name (or number) of a checked ``slurm.signal``, as bash's trap takes it: ``USR1``."""
    return signal.removeprefix("R:").split("@")[0]


def signal_seconds(signal: str) -> int:
    """Seconds before the time limit a checked ``slurm.signal`` fires."""
    return int(signal.split("@")[1])


def signal_option(signal: str) -> str:
    """The value of ``#SBATCH --signal`` for a checked ``slurm.signal``: always to the batch shell."""
    return ("RB:" if signal.startswith("R:") else "B:") + signal.removeprefix("R:")


Signal = Annotated[str, AfterValidator(check_signal)]

# ---- --mail-type ---------------------------------------------------------------------------------

MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
              "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS")


def check_mail_type(text: str) -> str:
    """A comma-separated list of sbatch's mail types (any case), normalized to upper case."""
    types = [t.strip().upper() for t in text.split(",")]
    for t in types:
        if t not in MAIL_TYPES:
            raise ValueError(f"{t or '(empty)'!r} is not a mail type sbatch knows: {', '.join(MAIL_TYPES)} "
                             "(a comma-separated list)")
    if len(set(types)) != len(types):
        raise ValueError(f"{text!r} names a mail type twice")
    if "NONE" in types and len(types) > 1:
        raise ValueError(f"{text!r}: NONE turns mail off; it cannot go with other types")
    return ",".join(types)


MailTypes = Annotated[str, AfterValidator(check_mail_type)]

# ---- names: partition, account, qos, reservation, constraint, GPU type ---------------------------
# Slurm keeps each as one token (slurm.conf, the accounting database), so a space, quote or '#' in one
# can only fail; free text (job name, comment, mail user) is quoted for sbatch by the script instead.

_BAD_IN_WORD = re.compile(r"[\s#'\"\\`$;]|[\x00-\x1f\x7f]")


def check_word(text: str) -> str:
    """A Slurm name of one token: no space, quote, '#' or shell character, not starting with '-' (sbatch
    would read an option). Empty means left out."""
    bad = _BAD_IN_WORD.search(text)
    if bad:
        raise ValueError(f"{text!r} is not one word: it holds {bad.group()!r}, which would break its #SBATCH line")
    if text.startswith("-"):
        raise ValueError(f"{text!r} starts with '-': sbatch would read it as an option")
    return text


Word = Annotated[str, AfterValidator(check_word)]

# sbatch options whose value is such a word, when given verbatim in slurm.extra_directives
WORD_OPTIONS = ("--partition", "-p", "--account", "-A", "--qos", "-q", "--reservation", "--constraint", "-C")
