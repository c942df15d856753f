"""Ejected templates (`slurmrl templates eject DIR` + `templates_dir`): any Jinja mistake in them is
one line naming the template file and line, exit 2, no traceback, nothing written. Variants: many
broken templates (syntax errors, undefined names under StrictUndefined, a missing include, a filter
that raises, an unknown filter, bytes that are not UTF-8), each put on a line of a template that the
render reaches."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from slurmrl import cli

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "slurmrl" / "templates"
RECIPE_TEXT = (ROOT / "recipes" / "rl-debug.toml").read_text()

# (what is put on the line, a word the error must say); each fails wherever the render reaches it
SYNTAX = [
    ("{{ }}", "expected"),
    ("{{ plan.name | }}", "expected"),
    ("{{ 1 + }}", "expected"),
    ("{% endif %}", "endif"),
    ("{% endfor %}", "endfor"),
    ("{% frobnicate %}", "frobnicate"),
    ("{{ plan.name ) }}", "unexpected"),
    ("{% include %}", "expected"),
]
RUNTIME = [
    # Jinja 3 checks a filter's name when the line runs: in a branch never taken it is no error
    ("{{ plan.name|no_such_filter }}", "no_such_filter"),
    ("{{ no_such_name }}", "no_such_name"),
    ("{{ plan.no_such_field }}", "undefined"),
    ("{{ plan.name.upper().nothing_here }}", "undefined"),
    ('{% include "_not_there.j2" %}', "_not_there.j2"),
    ('{{ "a\\nb"|sbatch_value }}', "line break"),
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ('{{ "%d"|format("x") }}', "TypeError"),
]
# templates and the lines of each that every render of rl-debug reaches (outside any if/for)
REACHED = ["job.sbatch.j2", "slurmrl-functions.sh.j2", "_ports.j2", "_task.j2", "_directives.j2", "_launch.j2"]


def top_level_lines(text: str) -> list[int]:
    """0-based line indexes at nesting depth 0 (an insertion there always runs)."""
    depth, out = 0, []
    for i, line in enumerate(text.split("\n")):
        if depth == 0:
            out.append(i)
        depth += len(re.findall(r"\{%-?\s*(?:if|for)\b", line)) - len(re.findall(r"\{%-?\s*end(?:if|for)\b", line))
    return out


@pytest.fixture(scope="module")
def ejected(tmp_path_factory):
    base = tmp_path_factory.mktemp("eject")
    assert cli.main(["templates", "eject", str(base / "pristine")]) == 0
    return base


def setup_case(base: Path, case: str) -> tuple[Path, Path]:
    """A fresh copy of the ejected templates and a recipe that uses them."""
    tpl = base / case / "tpl"
    if tpl.parent.exists():
        shutil.rmtree(tpl.parent)
    shutil.copytree(base / "pristine", tpl)
    recipe = base / case / "r.toml"
    recipe.write_text('templates_dir = "tpl"\n' + RECIPE_TEXT)
    return tpl, recipe


def render_fails(capsys, recipe: Path, run_dir: Path, where: str, word: str) -> None:
    capsys.readouterr()
    rc = cli.main(["render", str(recipe), "--run-dir", str(run_dir)])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert out == "" and "Traceback" not in err
    assert err.count("\n") == 1, err
    assert err.startswith(f"slurmrl: error: {where}: "), (where, err)
    assert word.lower() in err.lower(), err
    assert not run_dir.exists()  # nothing written


def insert(tpl: Path, name: str, index: int, text: str) -> int:
    path = tpl / name
    lines = path.read_text().split("\n")
    at = top_level_lines(path.read_text())[index % len(top_level_lines(path.read_text()))]
    lines.insert(at, text)
    path.write_text("\n".join(lines))
    return at + 1  # the 1-based line of the inserted text


SETTINGS = settings(max_examples=30, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
                    suppress_health_check=[HealthCheck.function_scoped_fixture])  # each case renders: no shrinking


@SETTINGS
@given(name=st.sampled_from(REACHED), index=st.integers(0, 10_000), mistake=st.sampled_from(SYNTAX + RUNTIME))
def test_a_mistake_in_any_reached_template_names_its_file_and_line(ejected, capsys, name, index, mistake):
    text, word = mistake
    tpl, recipe = setup_case(ejected, "case")
    line = insert(tpl, name, index, text)
    render_fails(capsys, recipe, ejected / "case" / "run", f"{tpl / name}:{line}", word)


@SETTINGS
@given(name=st.sampled_from(sorted(p.name for p in PACKAGE.glob("*.j2"))), index=st.integers(0, 10_000),
       mistake=st.sampled_from(SYNTAX))
def test_a_syntax_error_anywhere_in_any_template_is_one_line_naming_the_file(ejected, capsys, name, index, mistake):
    """Syntax errors fail even in branches the render never takes (Jinja compiles whole files)."""
    text, _ = mistake
    tpl, recipe = setup_case(ejected, "syntax")
    path = tpl / name
    lines = path.read_text().split("\n")
    lines.insert(index % len(lines), text)
    path.write_text("\n".join(lines))
    capsys.readouterr()
    rc = cli.main(["render", str(recipe), "--run-dir", str(ejected / "syntax" / "run")])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "Traceback" not in err and err.count("\n") == 1, err
    assert re.match(rf"slurmrl: error: {re.escape(str(tpl))}/[\w.-]+\.j2:\d+: ", err), err
    assert not (ejected / "syntax" / "run").exists()


@SETTINGS
@given(name=st.sampled_from(REACHED), index=st.integers(0, 10_000),
       bad=st.sampled_from([b"\xff", b"\xfe\xfe", b"caf\xe9", b"\x80abc", b"\xc3"]))
def test_a_template_that_is_not_utf8_names_the_file_and_line(ejected, capsys, name, index, bad):
    tpl, recipe = setup_case(ejected, "bytes")
    path = tpl / name
    lines = path.read_bytes().split(b"\n")
    at = index % len(lines)
    lines.insert(at, b"# " + bad + b" here")
    path.write_bytes(b"\n".join(lines))
    render_fails(capsys, recipe, ejected / "bytes" / "run", f"{path}:{at + 1}", "UTF-8")


def test_a_template_that_includes_itself_is_one_line(ejected, capsys):
    tpl, recipe = setup_case(ejected, "loop")
    (tpl / "_task.j2").write_text('{% include "_task.j2" %}\n' + (tpl / "_task.j2").read_text())
    render_fails(capsys, recipe, ejected / "loop" / "run", f"{tpl / '_task.j2'}:1", "includes itself")


def test_an_ejected_dir_from_before_the_helper_file_renders_the_packaged_helper(ejected, tmp_path, capsys):
    tpl, recipe = setup_case(ejected, "old")
    (tpl / "slurmrl-functions.sh.j2").unlink()
    capsys.readouterr()
    assert cli.main(["render", str(recipe), "--run-dir", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "slurmrl-functions.sh").read_text() == (ROOT / "sbatch" / "slurmrl-functions.sh").read_text()


def test_the_packaged_templates_are_not_touched(ejected):
    assert sorted(p.name for p in (ejected / "pristine").iterdir()) == sorted(p.name for p in PACKAGE.glob("*.j2"))
