"""Issue 32 item 4: times, memory sizes, signals and mail types are parsed by one module
(slurmrl.recipe.slurm_values) that follows sbatch 22.05's own parser, not Python's idea of a digit.

Where the cases come from (Slurm 22.05 source):
- src/common/parse_time.c ``time_str2secs``/``_is_valid_timespec``: C ``isdigit`` (ASCII only); the
  forms min, min:sec, hr:min:sec, days-hr, days-hr:min, days-hr:min:sec; "-1", "INFINITE", "UNLIMITED"
  (any case) mean no limit;
- src/common/proc_args.c ``str_to_mbytes``: ``strtoll`` digits, then nothing (MB) or K/M/G/T in any
  case, optionally followed by B/b (``_end_on_byte``);
- src/common/proc_args.c ``signals_mapping`` and ``sig_name2num``: 16 names (HUP INT QUIT ABRT KILL
  ALRM TERM USR1 USR2 URG CONT STOP TSTP TTIN TTOU XCPU), "SIG" prefix optional, any case; a number
  is taken as that number (``get_signal_opts``);
- sbatch(1) ``--mail-type``: NONE BEGIN END FAIL REQUEUE ALL INVALID_DEPEND STAGE_OUT TIME_LIMIT
  TIME_LIMIT_90 TIME_LIMIT_80 TIME_LIMIT_50 ARRAY_TASKS.
With the local cluster, sbatch itself is asked (``--test-only``) about values on both sides."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmrl.errors import UserError
from slurmrl.recipe import slurm_values as sv
from slurmrl.recipe.load import apply_overrides, read_toml, validate
from slurmrl.rundir.tomlw import _value

ROOT = Path(__file__).resolve().parent.parent
RL = ROOT / "slurmrl" / "recipes" / "rl-debug.toml"
MANY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SBATCH_NAMES = ["HUP", "INT", "QUIT", "ABRT", "KILL", "ALRM", "TERM", "USR1", "USR2", "URG", "CONT", "STOP",
                "TSTP", "TTIN", "TTOU", "XCPU"]
LINUX_ONLY = ["ILL", "TRAP", "BUS", "FPE", "SEGV", "PIPE", "STKFLT", "CHLD", "XFSZ", "VTALRM", "PROF", "WINCH",
              "IO", "POLL", "PWR", "SYS", "IOT", "CLD", "RTMIN", "EMT"]
# digits of other scripts (Arabic-Indic, Devanagari, fullwidth, mathematical bold, ...): str.isdigit() says yes
OTHER_DIGITS = [c for c in map(chr, range(0x80, 0x20000)) if unicodedata.category(c) == "Nd"]


def load(**fields):
    data = read_toml(RL)
    return validate(apply_overrides(data, [f"{k}={_value(v)}" for k, v in fields.items()]))


def refused(field: str, value) -> str:
    with pytest.raises(UserError) as e:
        load(**{field: value})
    assert e.value.field == field and "\n" not in str(e.value), e.value
    return e.value.message


# ---- valid values, as sbatch's parser takes them ----------------------------------------------------
n = st.integers(0, 9999).map(str)
times = st.one_of(n, st.tuples(n, n).map(":".join), st.tuples(n, n, n).map(":".join),
                  st.tuples(st.integers(0, 30).map(str), n).map("-".join),
                  st.tuples(st.integers(0, 30).map(str), n, n).map(lambda t: f"{t[0]}-{t[1]}:{t[2]}"),
                  st.tuples(st.integers(0, 30).map(str), n, n, n).map(lambda t: f"{t[0]}-{t[1]}:{t[2]}:{t[3]}"))
memory = st.tuples(st.integers(0, 60000).map(str), st.sampled_from(["", "K", "M", "G", "k", "m", "g", "t", "T"]),
                   st.sampled_from(["", "B", "b"])).map(lambda t: t[0] + t[1] + (t[2] if t[1] else ""))
names = st.sampled_from(SBATCH_NAMES).flatmap(
    lambda name: st.sampled_from([name, name.lower(), name.title(), f"SIG{name}", f"sig{name.lower()}", f"Sig{name}"]))


def with_other_digit(text: str, data) -> str:
    spots = [i for i, c in enumerate(text) if c in "0123456789"]
    i = data.draw(st.sampled_from(spots))
    return text[:i] + data.draw(st.sampled_from(OTHER_DIGITS)) + text[i + 1:]


@MANY
@given(text=times)
def test_every_time_form_sbatch_parses_is_taken(text):
    try:
        seconds = sv.time_seconds(text)
    except ValueError:
        raise AssertionError(text) from None
    parts = [int(x) for x in re.split("[-:]", text)]
    if "-" in text:
        want = parts[0] * 86400 + parts[1] * 3600 + sum(p * m for p, m in zip(parts[2:], (60, 1)))
    else:
        want = {1: lambda p: p[0] * 60, 2: lambda p: p[0] * 60 + p[1], 3: lambda p: p[0] * 3600 + p[1] * 60 + p[2]}[
            len(parts)](parts)
    assert seconds == (want or None)


@MANY
@given(text=times, data=st.data())
def test_a_time_with_a_digit_of_another_script_is_refused(text, data):
    bad = with_other_digit(text, data)
    with pytest.raises(ValueError, match="not a Slurm time"):
        sv.time_seconds(bad)


@pytest.mark.parametrize("text", ["-1", "infinite", "Unlimited", "INFINITE", "0"])
def test_no_limit_spellings(text):
    assert sv.time_seconds(text) is None


@MANY
@given(text=memory)
def test_every_memory_size_sbatch_parses_is_taken(text):
    mb = sv.memory_mb(text)
    digits = int(re.match("[0-9]+", text).group())
    unit = text[len(str(digits)):][:1].upper() or "M"
    assert mb == digits * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}[unit]


@MANY
@given(text=memory, data=st.data())
def test_a_memory_size_with_a_digit_of_another_script_is_refused(text, data):
    with pytest.raises(ValueError, match="not a memory size"):
        sv.memory_mb(with_other_digit(text, data))


@pytest.mark.parametrize("text", ["", "G", "1.5G", "-1", "+1", " 1", "1 ", "1GG", "1BB", "1B", "1P", "1KiB", "1e3",
                                  "0x10", "1\n", "１２G", "١٢"])
def test_memory_sizes_sbatch_refuses(text):
    with pytest.raises(ValueError):
        sv.memory_mb(text)


@given(text=memory.filter(lambda t: sv.memory_mb(t) <= sv.memory_mb("64T")))
@settings(max_examples=30, deadline=None)
def test_the_recipe_takes_memory_sizes_verbatim(text):
    assert load(**{"slurm.mem": text}).slurm.mem == text


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_the_recipe_refuses_other_digits_in_every_slurm_typed_field(data):
    field, good = data.draw(st.sampled_from([("slurm.time", "1-02:03:04"), ("slurm.max_total_time", "10:00:00"),
                                             ("slurm.mem", "200G"), ("slurm.signal", "USR1@120"),
                                             ("slurm.signal", "40@90")]))
    refused(field, with_other_digit(good, data))


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_typed_options_in_extra_directives_go_through_the_same_checks(data):
    option, good = data.draw(st.sampled_from([("--time-min", "1-02:00"), ("--mem-per-cpu", "4G"),
                                              ("--mem-per-gpu", "80000"), ("-t", "90:30"), ("--signal", "B:USR2@60")]))
    assert load(**{"slurm.extra_directives": [f"{option}={good}"]})
    refused("slurm.extra_directives", [f"{option}={with_other_digit(good, data)}"])


# ---- signals --------------------------------------------------------------------------------------------
@MANY
@given(name=names, flag=st.sampled_from(["", "R:", "B:", "RB:"]), secs=st.none() | st.integers(0, 65535))
def test_sbatchs_16_signal_names(name, flag, secs):
    text = flag + name + ("" if secs is None else f"@{secs}")
    base = name.upper().removeprefix("SIG")
    try:
        out = sv.check_signal(text)
    except ValueError as e:
        assert base in ("KILL", "STOP", "TERM"), e
        return
    assert out == f"{'R:' if 'R' in flag else ''}{base}@{60 if secs is None else secs}"
    assert sv.signal_name(out) in SBATCH_NAMES


@pytest.mark.parametrize("name", LINUX_ONLY)
@pytest.mark.parametrize("form", ["{}", "SIG{}", "{}@30"])
def test_names_sbatch_does_not_know_are_refused(name, form):
    with pytest.raises(ValueError, match="not a signal name sbatch knows"):
        sv.check_signal(form.format(name))


@given(number=st.integers(1, 64), secs=st.none() | st.integers(0, 65535), zeros=st.integers(0, 2))
@settings(max_examples=150, deadline=None)
def test_numbers_stay_numbers(number, secs, zeros):
    text = "0" * zeros + str(number) + ("" if secs is None else f"@{secs}")
    if number in (9, 15, 17, 19, 32, 33):
        with pytest.raises(ValueError):
            sv.check_signal(text)
        return
    out = sv.check_signal(text)
    assert out == f"{number}@{60 if secs is None else secs}"  # never rewritten into a name sbatch may not know
    assert sv.signal_option(out) == f"B:{number}@{60 if secs is None else secs}"


@given(data=st.data())
@settings(max_examples=100, deadline=None)
def test_signal_digits_of_another_script_are_refused(data):
    good = data.draw(st.sampled_from(["10", "40@90", "USR1@120", "R:34@5", "B:2"]))
    with pytest.raises(ValueError):
        sv.check_signal(with_other_digit(good, data))


@given(types=st.lists(st.sampled_from(sv.MAIL_TYPES), min_size=1, max_size=4, unique=True), lower=st.booleans())
@settings(max_examples=100, deadline=None)
def test_mail_types(types, lower):
    text = ",".join(t.lower() if lower else t for t in types)
    if "NONE" in types and len(types) > 1:
        with pytest.raises(ValueError):
            sv.check_mail_type(text)
    else:
        assert sv.check_mail_type(text) == ",".join(types)


# ---- sbatch itself agrees ------------------------------------------------------------------------------------
TAKEN = ["--signal=B:TTOU@30", "--signal=B:40@90", "--signal=B:abrt", "--signal=RB:XCPU@65535", "--mem=1gb",
         "--mem=512m", "--mem=0", "--time=-1", "--time=1-2", "--time=90:30"]
REFUSED = ["--signal=B:WINCH", "--signal=B:SEGV@60", "--signal=B:PWR", "--mem=1P", "--mem=١٢G", "--time=١٢",
           "--time=１２:00", "--signal=B:１０"]


def test_every_taken_value_is_what_the_module_writes():
    assert sv.check_signal("ttou@30") == "TTOU@30" and sv.check_signal("40@90") == "40@90"
    assert sv.check_signal("SIGabrt") == "ABRT@60" and sv.check_signal("R:xcpu@65535") == "R:XCPU@65535"
    for text in ("1gb", "512m", "0"):
        sv.memory_mb(text)
    for text in ("-1", "1-2", "90:30"):
        sv.time_seconds(text)
    for text in ("WINCH", "SEGV@60", "PWR", "１０"):
        with pytest.raises(ValueError):
            sv.check_signal(text)


@pytest.mark.cluster
@pytest.mark.parametrize("option", TAKEN + REFUSED)
def test_the_local_sbatch_agrees(slurm_cluster, option, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    r = slurm_cluster.run(["sbatch", "--test-only", "-N1", option, str(script)], cwd=tmp_path)
    if option in TAKEN:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode != 0, r.stderr
