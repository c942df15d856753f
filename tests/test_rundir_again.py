"""`submit --again` reads a run dir back (lock.toml, links.json, jobs.json): a hand-edited value can
neither reach the new job.sbatch as a line of shell nor leave a half-written run dir behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmrl.app.again import again
from slurmrl.app.build import build, render
from slurmrl.errors import UserError
from slurmrl.rundir.paths import RunDir

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def old(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return render(ROOT / "recipes" / "sft-debug.toml").run_dir


def set_lock_value(run_dir: Path, key: str, toml_value: str) -> None:
    lock = RunDir(run_dir).lock
    text = lock.read_text()
    text, n = re.subn(rf"^{key} = .*$", lambda _: f"{key} = {toml_value}", text, count=1, flags=re.M)
    if not n:
        text = text.replace("[lock]\n", f"[lock]\n{key} = {toml_value}\n", 1)
    lock.write_text(text)


@pytest.mark.parametrize("value", ['"x.toml\\necho pwned"', '"x.toml\\recho pwned"', '"x\\u2028echo"',
                                   '"x\\u000becho"', '""', "3", "[]", "{ a = 1 }"])
def test_a_recipe_file_name_that_is_not_one_line_is_refused(old, value):
    set_lock_value(old, "recipe_file", value)
    with pytest.raises(UserError, match="lock.toml"):
        again(str(old))
    assert sorted(p.name for p in old.parent.iterdir() if not p.name.startswith(".")) == [old.name]


@pytest.mark.parametrize("text", ["[lock", "[lock]\nformat = 1\npreflight = \"yes\"\n", "\x00\x01", "lock = 3\n"])
def test_a_broken_lock_is_one_line_and_nothing_is_written(old, text):
    RunDir(old).lock.write_text(text)
    with pytest.raises(UserError, match="lock.toml"):
        again(str(old))
    assert [p.name for p in old.parent.iterdir() if not p.name.startswith(".")] == [old.name]


@pytest.mark.parametrize("links", ['{"again_as": 5}', "[1, 2]", "{", '{"again_of": "a\\nb"}'])
def test_a_broken_links_file_is_refused_before_anything_is_written(old, links):
    RunDir(old).links.write_text(links)
    with pytest.raises(UserError, match="links.json"):
        again(str(old))
    assert [p.name for p in old.parent.iterdir() if not p.name.startswith(".")] == [old.name]


def test_the_header_comment_cannot_be_broken_at_render(tmp_path):
    with pytest.raises(UserError, match="line break"):
        build(ROOT / "recipes" / "sft-debug.toml", run_dir=tmp_path / "r", source_name="a.toml\nrm -rf ~")
    with pytest.raises(UserError, match="line break"):
        build(ROOT / "recipes" / "sft-debug.toml", run_dir=tmp_path / "r", source_name="a.toml\u2028x")


def test_a_well_formed_lock_still_runs_again(old):
    set_lock_value(old, "recipe_file", '"renamed recipe.toml"')
    new = again(str(old))
    assert RunDir(new).script.read_text().splitlines()[1].endswith("rendered from renamed recipe.toml.")
