"""Slurm's own spellings (issue 27 item 4): every form sbatch(1) documents for the values slurmrl
writes on #SBATCH lines is taken and written as Slurm reads it; what sbatch refuses, or what cannot
work in a slurmrl job, is refused at load with the field named.

The forms come from sbatch(1) (Slurm 22.05):
- ``--time``: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
  "days-hours:minutes" and "days-hours:minutes:seconds"; "A time limit of zero requests that no time
  limit be imposed" (UNLIMITED and INFINITE are Slurm's words for it).
- ``--signal=[{R|B}:]<sig_num>[@sig_time]``: "sig_num may either be a signal number or name (e.g. "10"
  or "USR1"). sig_time must have an integer value between 0 and 65535 ... If a sig_num is specified
  without any sig_time, the default time will be 60 seconds."
- ``--mail-type``: NONE, BEGIN, END, FAIL, REQUEUE, ALL, INVALID_DEPEND, STAGE_OUT, TIME_LIMIT,
  TIME_LIMIT_90, TIME_LIMIT_80, TIME_LIMIT_50, ARRAY_TASKS; "Multiple type values may be specified in
  a comma separated list."
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmrl.errors import UserError
from slurmrl.plan import plan
from slurmrl.recipe.load import apply_overrides, read_toml, validate
from slurmrl.recipe.slurm_values import MAIL_TYPES
from slurmrl.rundir.tomlw import _value

ROOT = Path(__file__).resolve().parent.parent
RL = ROOT / "recipes" / "rl-debug.toml"
INF = ROOT / "recipes" / "inference-replicas.toml"
RUN_DIR = "/cluster/runs/spellings"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def load(recipe: Path, **fields):
    data = read_toml(recipe)
    return validate(apply_overrides(data, [f"{k}={_value(v)}" for k, v in fields.items()]))


def directives(recipe: Path, **fields) -> dict[str, list[str | None]]:
    """option -> values on the first het group's #SBATCH lines."""
    p = plan(load(recipe, **fields), RUN_DIR)
    out: dict[str, list[str | None]] = {}
    for d in p.groups[0].directives:
        out.setdefault(d.option, []).append(d.value)
    return out


def refused(field: str, value, recipe: Path = RL) -> str:
    with pytest.raises(UserError) as e:
        load(recipe, **{field: value})
    assert e.value.field == field, e.value
    assert "\n" not in str(e.value)
    return e.value.message


# ---- --time -------------------------------------------------------------------------------------

digits = st.integers(0, 999)


@st.composite
def slurm_times(draw) -> tuple[str, int]:
    """(text in one of sbatch's six documented forms, the seconds Slurm reads from it)."""
    form = draw(st.sampled_from(["m", "m:s", "h:m:s", "d-h", "d-h:m", "d-h:m:s"]))
    pad = draw(st.booleans())  # 01 or 1: Slurm reads both

    def num(hi: int = 999) -> tuple[str, int]:
        n = draw(st.integers(0, hi))
        return (f"{n:02d}" if pad else str(n)), n
    if form == "m":
        (a, m), = [num(600000)]
        return a, m * 60
    if form == "m:s":
        (a, m), (b, s) = num(), num(59)
        return f"{a}:{b}", m * 60 + s
    if form == "h:m:s":
        (a, h), (b, m), (c, s) = num(), num(59), num(59)
        return f"{a}:{b}:{c}", h * 3600 + m * 60 + s
    (d_, d) = num(400)
    (a, h) = num(23)
    if form == "d-h":
        return f"{d_}-{a}", d * 86400 + h * 3600
    (b, m) = num(59)
    if form == "d-h:m":
        return f"{d_}-{a}:{b}", d * 86400 + h * 3600 + m * 60
    (c, s) = num(59)
    return f"{d_}-{a}:{b}:{c}", d * 86400 + h * 3600 + m * 60 + s


@FAST
@given(slurm_times())
def test_every_documented_time_form_is_taken_and_written_as_given(case):
    text, seconds = case
    if seconds > 365 * 86400:
        assert "365 days" in refused("slurm.time", text)
        return
    d = directives(RL, **{"slurm.time": text})
    assert d["--time"] == [text]


@pytest.mark.parametrize("text", ["0", "UNLIMITED", "unlimited", "INFINITE", "Infinite"])
def test_no_time_limit_is_taken(text):
    d = directives(INF, **{"slurm.time": text})
    assert d["--time"] == [text if text == "0" else text.upper()]


@pytest.mark.parametrize("text", ["0", "UNLIMITED", "INFINITE"])
def test_no_limit_is_not_a_total_budget(text):
    assert "leave the field out" in refused("slurm.max_total_time", text)


@FAST
@given(st.text(min_size=1, max_size=12))
def test_anything_else_as_a_time_is_refused_naming_the_field(text):
    documented = re.fullmatch(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}", text, re.ASCII)
    if documented or text.upper() in ("UNLIMITED", "INFINITE"):
        return
    msg = refused("slurm.time", text)
    assert "not a Slurm time" in msg or "control character" in msg  # every recipe string refuses those first


# ---- --signal -----------------------------------------------------------------------------------

# sbatch 22.05's names (signals_mapping, src/common/proc_args.c) the script can take, with Linux's numbers
LINUX = {"HUP": 1, "INT": 2, "QUIT": 3, "ABRT": 6, "USR1": 10, "USR2": 12, "ALRM": 14, "CONT": 18, "URG": 23,
         "XCPU": 24, "TSTP": 20, "TTIN": 21, "TTOU": 22}
CANNOT = {"KILL": 9, "STOP": 19, "TERM": 15}  # uncatchable, or the script's own (CHLD, 17: by number only)


def cases(name: str) -> st.SearchStrategy[str]:
    return st.sampled_from([name, name.lower(), name.title(), f"SIG{name}", f"sig{name.lower()}"])


@st.composite
def signals(draw, table: dict[str, int]) -> tuple[str, str, int, bool]:
    """(sbatch's --signal text, the signal as written back (its name, or the number given), the seconds, R flag)."""
    name = draw(st.sampled_from(sorted(table)))
    by_number = draw(st.booleans())
    sig = str(table[name]) if by_number else draw(cases(name))
    prefix = draw(st.sampled_from(["", "B:", "b:", "R:", "r:", "RB:", "BR:", "rb:"]))
    seconds = draw(st.none() | st.integers(0, 65535))
    text = prefix + sig + ("" if seconds is None else f"@{seconds}")
    return text, str(table[name]) if by_number else name, 60 if seconds is None else seconds, "R" in prefix.upper()


@FAST
@given(signals(LINUX))
def test_every_documented_signal_form_is_taken_and_sent_to_the_batch_shell(case):
    text, name, seconds, resv = case
    p = plan(load(RL, **{"slurm.signal": text}), RUN_DIR)
    [value] = [d.value for d in p.groups[0].directives if d.option == "--signal"]
    assert value == f"{'RB' if resv else 'B'}:{name}@{seconds}"  # the script traps it: always B
    assert p.signal == name


@FAST
@given(signals(CANNOT))
def test_a_warning_signal_the_script_cannot_take_is_refused(case):
    text, name, _, _ = case
    number = int(name) if name.isascii() and name.isdigit() else CANNOT[name]
    assert f"SIG{next(n for n, v in CANNOT.items() if v == number)}" in refused("slurm.signal", text)


@pytest.mark.parametrize("number", [34, 40, 64])
def test_real_time_signals_are_taken_by_number(number):
    p = plan(load(RL, **{"slurm.signal": f"{number}@90"}), RUN_DIR)
    assert p.signal == str(number)


@pytest.mark.parametrize("text, says", [
    ("USR1@65536", "0-65535"), ("USR1@" + "9" * 5000, "0-65535"), ("USR1@-1", "SIGNAL[@SECONDS]"),
    ("USR1@1.5", "SIGNAL[@SECONDS]"),
    ("0@60", "not a signal a program can take"), ("65", "not a signal a program can take"),
    ("32", "not a signal a program can take"), ("USR3", "not a signal name"), ("SIG", "not a signal name"),
    ("X:USR1", "SIGNAL[@SECONDS]"), ("B:", "SIGNAL[@SECONDS]"), ("@60", "SIGNAL[@SECONDS]"), ("USR1@", "SIGNAL"),
    ("USR1 @60", "SIGNAL[@SECONDS]"), ("", "SIGNAL[@SECONDS]"),
])
def test_signals_sbatch_refuses_are_refused(text, says):
    assert says in refused("slurm.signal", text)


def test_leading_zeros_in_the_seconds_are_read_as_sbatch_reads_them():
    p = plan(load(RL, **{"slurm.signal": "USR1@000120"}), RUN_DIR)
    assert [d.value for d in p.groups[0].directives if d.option == "--signal"] == ["B:USR1@120"]


def test_an_unsigned_signal_warning_counts_sbatchs_default_60_seconds():
    r = load(INF, **{"slurm.signal": "USR2", "slurm.time": "10"})  # fires at 540 s, before the startup timeout
    p = plan(r, RUN_DIR)
    assert any("slurm.signal USR2@60 fires 540 s" in w for w in p.warnings), p.warnings


@pytest.mark.parametrize("text", ["1", "1@30:00", "9999@1-0", "2@0", "4@90", "3@1-02:03:04"])
def test_switches_take_a_count_and_a_slurm_time(text):
    p = plan(load(INF, **{"slurm.switches": {"inference": text}}), RUN_DIR)
    assert [d.value for g in p.groups for d in g.directives if d.option == "--switches"] == [text]


@pytest.mark.parametrize("text, says", [("0", "COUNT"), ("10000", "COUNT"), ("1@", "COUNT"), ("x@1", "COUNT"),
                                        ("1@soon", "not a Slurm time"), ("1@400-0", "365 days")])
def test_switches_sbatch_would_refuse_are_refused(text, says):
    with pytest.raises(UserError) as e:
        load(INF, **{"slurm.switches": {"inference": text}})
    assert e.value.field == "slurm.switches.inference" and says in e.value.message, e.value


# ---- --mail-type --------------------------------------------------------------------------------

CASE = st.sampled_from([str.upper, str.lower, str.title])


@FAST
@given(st.lists(st.sampled_from([t for t in MAIL_TYPES if t != "NONE"]), min_size=1, max_size=5, unique=True),
       st.lists(CASE, min_size=5, max_size=5))
def test_every_mail_type_list_is_taken_in_upper_case(types, spell):
    text = ",".join(f(t) for f, t in zip(spell, types))
    assert directives(RL, **{"slurm.mail_type": text})["--mail-type"] == [",".join(types)]


def test_none_alone_is_a_mail_type_but_not_with_others():
    assert directives(RL, **{"slurm.mail_type": "none"})["--mail-type"] == ["NONE"]
    assert "cannot go with other types" in refused("slurm.mail_type", "NONE,END")


@FAST
@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=","),
               min_size=1, max_size=15))
def test_a_mail_type_slurm_does_not_know_is_refused(word):
    if word.upper() in MAIL_TYPES:
        return
    assert "not a mail type" in refused("slurm.mail_type", f"END,{word}")


@pytest.mark.parametrize("text", ["END,", ",END", "END,,FAIL", "END,END", "END FAIL"])
def test_malformed_mail_type_lists_are_refused(text):
    refused("slurm.mail_type", text)


# ---- names: one word on their #SBATCH line ------------------------------------------------------

WORD_FIELDS = ["slurm.partition", "slurm.cpu_partition", "slurm.account", "slurm.qos", "slurm.constraint",
               "slurm.gpu_type"]


@FAST
@given(st.sampled_from(WORD_FIELDS), st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.,:&|\[\]-]{0,20}\Z"))
def test_names_of_one_word_are_taken(field, word):
    load(RL, **{field: word})


@FAST
@given(st.sampled_from(WORD_FIELDS), st.text(max_size=8), st.sampled_from([" ", "\t", "#", "'", '"', "\n", "\\"]),
       st.text(max_size=8))
def test_a_name_that_is_not_one_word_is_refused_naming_the_field(field, head, bad, tail):
    msg = refused(field, head + bad + tail)
    assert "one word" in msg or "line breaks" in msg or "control character" in msg


@pytest.mark.parametrize("field", WORD_FIELDS)
def test_a_name_that_starts_with_a_dash_is_refused(field):
    assert "starts with '-'" in refused(field, "-gpu")


@pytest.mark.parametrize("directive", ["--reservation=my res", "--reservation=#x", "--partition=a'b",
                                       "--constraint=-x", "--qos=a\tb"])
def test_extra_directives_with_a_broken_name_are_refused(directive):
    refused("slurm.extra_directives", [directive])


def test_extra_directives_with_names_are_taken():
    d = directives(RL, **{"slurm.extra_directives": ["--reservation=big", "--constraint=[rack1|rack2]"]})
    assert d["--reservation"] == ["big"]


# ---- the local cluster's real sbatch reads what is rendered ------------------------------------

SPELLINGS = [
    {"slurm.signal": "sigusr2", "slurm.time": "1-2", "slurm.mail_type": "time_limit_90,array_tasks"},
    {"slurm.signal": "R:10@5", "slurm.time": "90:30", "slurm.mail_type": "ALL"},
    {"slurm.signal": "b:hup@000120", "slurm.time": "infinite", "slurm.mail_type": "NONE"},
    {"slurm.signal": "40", "slurm.time": "0", "slurm.mail_type": "stage_out,invalid_depend,requeue"},
    {"slurm.signal": "RB:USR1@65535", "slurm.time": "2-00:00:01", "slurm.mail_type": "TIME_LIMIT_50"},
    {"slurm.signal": "SIGUSR1@0", "slurm.time": "1-2:30", "slurm.mail_user": "me@example.org", "slurm.mail_type": "END"},
]


@pytest.mark.cluster
@pytest.mark.parametrize("fields", SPELLINGS, ids=[f["slurm.signal"] for f in SPELLINGS])
def test_the_local_sbatch_takes_every_rendered_spelling(fields, tmp_path):
    import os
    import subprocess

    from slurmrl.app.build import build

    conf = Path(os.environ.get("SLURMRL_TEST_CLUSTER_DIR", "/tmp/slurmrl-test-cluster")) / "etc" / "slurm.conf"
    if not conf.exists():
        pytest.skip("no local Slurm cluster")
    recipe = ROOT / "recipes" / "inference-debug.toml"
    sets = [f"{k}={_value(v)}" for k, v in fields.items()] + ['model.path="/m"']
    script = tmp_path / "job.sbatch"
    script.write_text(build(recipe, sets, run_dir=tmp_path / "run").script)
    t = subprocess.run(["sbatch", "--test-only", str(script)], env={**os.environ, "SLURM_CONF": str(conf)},
                       capture_output=True, text=True, timeout=60)
    assert t.returncode == 0 and "to start at" in t.stderr, t.stderr
