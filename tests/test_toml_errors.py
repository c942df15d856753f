"""TOML that does not parse is said in slurmrl's words, at tomllib's line and column, whatever
TOML library is installed (tomlkit 0.15 once moved both under the tests)."""

from __future__ import annotations

import re
import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmrl import toml_errors

CASES = [
    ('name = "x"\n[model]\npath = "m"\npath = "n"\n', 'key "path" is given twice', "line 4, column 11"),
    ('a.b = 1\na.b.c = 2\n', 'key "a.b.c" is given twice', "line 2"),
    ('[a]\nb = 1\n[a.b]\n', 'key "a.b" is given twice', "line 3"),
    ('[model]\n[model]\n', "table [model] is declared twice", "line 2"),
    ('[[x]]\n[x]\n', "", "line 2"),
    ('v = {a = 1, a = 2}\n', 'key "a" is given twice in one inline table', "line 1"),
    ('name = "bad"\nkind = \n', "a value is missing", "line 2, column 8"),
    ('x = [1, 2\n', "an array ([...]) is not closed", "at end of document"),
    ('= 1\n', "is not `key = value`", "line 1, column 1"),
    ('a = 1 b = 2\n', "more text follows a value", "line 1, column 7"),
]


@pytest.mark.parametrize("text, words, where", CASES)
def test_each_error_in_our_words_at_tomllibs_position(text, words, where):
    with pytest.raises(ValueError) as e:
        toml_errors.loads(text)
    msg = str(e.value)
    assert words in msg and f"({'at ' if 'line' in where else ''}{where}" in msg
    assert "\n" not in msg and "already exists" not in msg
    with pytest.raises(tomllib.TOMLDecodeError) as t:
        tomllib.loads(text)
    assert re.search(r"\((at line \d+, column \d+|at end of document)\)$", str(t.value)).group(0) in msg


def test_nesting_beyond_the_stack_is_one_sentence():
    with pytest.raises(ValueError, match="nested too deeply"):
        toml_errors.loads("x = " + "[" * 5000 + "]" * 5000)


@given(st.text(max_size=60))
def test_any_text_parses_or_gives_one_line(text):
    try:
        tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError):
        with pytest.raises(ValueError) as e:
            toml_errors.loads(text)
        assert str(e.value) and "\n" not in str(e.value).rstrip("\n")
    else:
        assert toml_errors.loads(text) == tomllib.loads(text)
