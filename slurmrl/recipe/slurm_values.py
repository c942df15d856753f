"""Slurm's own spellings of the values slurmrl writes on #SBATCH lines: one home per kind of value.

Each check follows sbatch 22.05's own parser and refuses, with a ValueError saying why, what sbatch
would refuse or what cannot work in a slurmrl job. The recipe's fields use the ``Annotated`` types
below; the planner reads the values back through the helpers (``time_seconds``, ``signal_name``,
``signal_seconds``, ``signal_option``). Where each grammar comes from (Slurm 22.05 source):
- times: ``time_str2secs`` and ``_is_valid_timespec`` (src/common/parse_time.c): C ``isdigit``, so
  ASCII digits only; "-1", "INFINITE" and "UNLIMITED" (any case) are no limit;
- memory: ``str_to_mbytes`` (src/common/proc_args.c): ASCII digits, then nothing (megabytes) or one
  of K, M, G, T (any case), optionally followed by B;
- signals: ``get_signal_opts`` and ``sig_name2num`` (src/common/proc_args.c): a number, or one of the
  16 names of ``signals_mapping`` with or without SIG, any case; a number is sent as that number;
- mail types: ``parse_mail_type`` (src/common/slurm_opt.c), the list sbatch(1) documents.
Every digit is an ASCII digit: Python's ``\\d`` and ``str.isdigit`` take other scripts' digits
('١٢', fullwidth '１２'), which sbatch refuses, so neither is used here."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from slurmrl.settings.limits import MAX_DAYS, MAX_SIGNAL_SECONDS

# ---- times: --time, and slurmrl's total budget over requeues --------------------------------------

# sbatch --time: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
# "days-hours:minutes" and "days-hours:minutes:seconds"; 0 (or UNLIMITED / INFINITE) is no limit.
_D = "[0-9]"  # ASCII digits: sbatch's isdigit() in the C locale
_TIME = re.compile(rf"(?:({_D}{{1,7}})|({_D}{{1,7}}):({_D}{{1,7}})|({_D}{{1,7}}):({_D}{{1,7}}):({_D}{{1,7}})|"
                   rf"({_D}{{1,4}})-({_D}{{1,7}})(?::({_D}{{1,7}}))?(?::({_D}{{1,7}}))?)")
UNLIMITED = ("UNLIMITED", "INFINITE", "-1")
TIME_FORMS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def time_seconds(text: str) -> int | None:
    """Seconds in a Slurm time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``);
    None for no limit (``0``, ``UNLIMITED``, ``INFINITE``). ValueError for any other text."""
    if text.upper() in UNLIMITED:
        return None
    m = _TIME.fullmatch(text)
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
    if not (re.fullmatch(f"{_D}{{1,4}}", count) and 1 <= int(count) <= 9999) or (at and not wait):
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

# The 16 names sbatch 22.05 knows (signals_mapping in src/common/proc_args.c), with or without SIG, in
# any case; the numbers are Linux's. Any other name (BUS, SEGV, WINCH, ...) sbatch refuses.
SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "ABRT": 6, "KILL": 9, "ALRM": 14, "TERM": 15, "USR1": 10, "USR2": 12,
           "URG": 23, "CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22, "XCPU": 24}
MAX_SIGNAL = 64  # SIGRTMAX on Linux; 32 and 33 are the C library's own
UNUSABLE = {  # signals the script cannot take as its warning (by Linux number), and why
    9: ("KILL", "cannot be caught, so the script could not checkpoint"),
    19: ("STOP", "cannot be caught, so the script could not checkpoint"),
    15: ("TERM", "is how scancel and the time limit stop the script; pick another (USR1, USR2, ...)"),
    17: ("CHLD", "is sent whenever a child process exits; pick another (USR1, USR2, ...)"),
}
_SIGNAL = re.compile(r"(?:([RB]|RB|BR):)?([A-Za-z0-9]+)(?:@([0-9]+))?", re.I | re.ASCII)
DEFAULT_SIGNAL_SECONDS = 60  # sbatch(1): a sig_num without a sig_time is sent 60 seconds before the end


def check_signal(text: str) -> str:
    """``slurm.signal`` in sbatch's form, normalized to ``[R:]SIG@SECONDS``: SIG one of sbatch's names
    (upper case, no SIG prefix) or a number as given (sbatch and bash's trap take both), the seconds
    written out. The script always asks for it on the batch shell (``B:``)."""
    m = _SIGNAL.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not [R:|B:]SIGNAL[@SECONDS] as sbatch takes it, e.g. USR1@120")
    flags, sig, seconds = (m.group(1) or "").upper(), m.group(2).upper(), m.group(3)
    if re.fullmatch(f"{_D}+", sig):
        number = int(sig) if len(sig) <= 6 else MAX_SIGNAL + 1
        if not 1 <= number <= MAX_SIGNAL or number in (32, 33):
            raise ValueError(f"{text!r}: {sig} is not a signal a program can take (1-31, 34-{MAX_SIGNAL})")
        name = str(number)  # kept a number: sbatch and trap read it, and not every number has a name sbatch knows
    else:
        name = sig.removeprefix("SIG")
        if name not in SIGNALS:
            raise ValueError(f"{text!r}: {sig} is not a signal name sbatch knows ({', '.join(SIGNALS)}; "
                             "or give the number)")
        number = SIGNALS[name]
    if number in UNUSABLE:
        what, why = UNUSABLE[number]
        raise ValueError(f"{text!r}: SIG{what} {why}")
    digits = (seconds or "").lstrip("0") or "0"  # sbatch reads 0120 as 120
    secs = DEFAULT_SIGNAL_SECONDS if seconds is None else int(digits) if len(digits) <= 6 else MAX_SIGNAL_SECONDS + 1
    if secs > MAX_SIGNAL_SECONDS:
        raise ValueError(f"{text!r}: sbatch takes 0-{MAX_SIGNAL_SECONDS} seconds")
    return f"{'R:' if 'R' in flags else ''}{name}@{secs}"


def signal_name(signal: str) -> str:
    """The name (or number) of a checked ``slurm.signal``, as bash's trap takes it: ``USR1``, ``40``."""
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

# ---- memory sizes: --mem, --mem-per-cpu, --mem-per-gpu --------------------------------------------

_MEMORY = re.compile(f"({_D}+)([KMGT][B]?)?", re.I | re.ASCII)
_MB = {"K": 2**-10, "M": 1, "G": 2**10, "T": 2**20}


def memory_mb(text: str) -> float:
    """Megabytes in an sbatch memory size (``str_to_mbytes``): digits, then K, M, G or T (any case,
    optionally followed by B); no unit is megabytes. ValueError for any other text."""
    m = _MEMORY.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not a memory size like 0, 500G or 64000M (digits, then K, M, G or T)")
    unit = (m.group(2) or "M")[0].upper()
    return int(m.group(1)) * _MB[unit]


def check_memory(text: str, max_mb: int) -> str:
    """A memory size sbatch takes, of at most ``max_mb`` megabytes."""
    if memory_mb(text) > max_mb:
        raise ValueError(f"{text!r} is more than {max_mb >> 20}T per node")
    return text


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


def _memory_value(text: str) -> str:
    memory_mb(text)
    return text


# sbatch options with a Slurm-typed value, when given verbatim in slurm.extra_directives: the same checks
TYPED_OPTIONS = {"--time": check_time_limit, "-t": check_time_limit, "--time-min": check_time_limit,
                 "--mem": _memory_value, "--mem-per-cpu": _memory_value, "--mem-per-gpu": _memory_value,
                 "--signal": check_signal, "--mail-type": check_mail_type}
