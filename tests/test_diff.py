"""`slurmrl diff RUN_DIR` reports every edit to what the job reads (no cluster needed).

Every recipe in the gallery renders into a run dir that diff calls unchanged; an edit to one flag
in job.sbatch, to one value in components/trainer.toml, a missing file and an extra component
config are each reported with the changed line, and `submit`'s is_edited() agrees.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmrl import cli
from slurmrl.app.build import render
from slurmrl.app.diff import is_edited

RECIPES = Path(__file__).resolve().parent.parent / "slurmrl" / "recipes"
GALLERY = sorted(RECIPES.glob("*.toml"))


def diff(run_dir: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli.main(["diff", str(run_dir)])
    out, err = capsys.readouterr()
    assert err == ""
    return rc, out


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) >= 1, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("recipe", GALLERY, ids=[p.stem for p in GALLERY])
def test_a_fresh_render_has_no_changes(recipe, tmp_path, capsys):
    out = render(recipe, run_dir=tmp_path / recipe.stem)
    rc, text = diff(out.run_dir, capsys)
    assert (rc, text) == (0, f"{out.run_dir}: no changes (every file the job reads is as recipe.toml renders it)\n")
    assert is_edited(out.run_dir) is False


@pytest.mark.parametrize("recipe", GALLERY, ids=[p.stem for p in GALLERY])
def test_an_edited_sbatch_directive_is_reported(recipe, tmp_path, capsys):
    out = render(recipe, run_dir=tmp_path / recipe.stem)
    script = out.run_dir / "job.sbatch"
    line = re.search(r"^#SBATCH --job-name=.*$", script.read_text(), re.M)[0]
    edit(script, line, line + "-edited")
    rc, text = diff(out.run_dir, capsys)
    assert rc == 1
    assert text.startswith(f"--- {script} (rendered from recipe.toml)\n+++ {script}\n")
    assert f"\n-{line}\n+{line}-edited\n" in text
    assert is_edited(out.run_dir) is True


def test_an_edited_engine_flag_is_reported(tmp_path, capsys):
    out = render(RECIPES / "inference-1node.toml", run_dir=tmp_path / "run")
    script = out.run_dir / "job.sbatch"
    m = re.search(r"^(\s+--tensor-parallel-size )(\d+)(.*)$", script.read_text(), re.M)
    assert m, "the engine's command line is in job.sbatch, one flag per line"
    edit(script, m[0], f"{m[1]}{int(m[2]) * 2}{m[3]}")
    rc, text = diff(out.run_dir, capsys)
    assert rc == 1
    assert f"\n-{m[0]}\n+{m[1]}{int(m[2]) * 2}{m[3]}\n" in text


def test_an_edited_trainer_setting_is_reported(tmp_path, capsys):
    checked = []
    for recipe in GALLERY:
        out = render(recipe, run_dir=tmp_path / recipe.stem)
        config = out.run_dir / "components" / "trainer.toml"
        if not config.exists():
            continue
        line = re.search(r"^lr = .*$", config.read_text(), re.M)[0]
        edit(config, line, "lr = 0.5")
        rc, text = diff(out.run_dir, capsys)
        assert rc == 1, recipe.name
        assert text.startswith(f"--- {config} (rendered from recipe.toml)\n+++ {config}\n"), text
        assert f"\n-{line}\n+lr = 0.5\n" in text
        assert "job.sbatch" not in text  # only what changed
        assert is_edited(out.run_dir) is True
        checked.append(recipe.stem)
    assert checked, "no recipe in the gallery has a trainer"


def test_a_missing_file_and_an_extra_component_config_are_reported(tmp_path, capsys):
    out = render(RECIPES / "rl-debug.toml", run_dir=tmp_path / "run")
    run_dir = out.run_dir
    (run_dir / "plan.json").unlink()
    (run_dir / "components" / "mine.toml").write_text("answer = 42\n")
    rc, text = diff(run_dir, capsys)
    assert rc == 1
    assert f"--- {run_dir}/components/mine.toml (not rendered)\n+++ {run_dir}/components/mine.toml\n" in text
    assert "\n+answer = 42\n" in text
    assert f"--- {run_dir}/plan.json (rendered from recipe.toml)\n+++ {run_dir}/plan.json (missing)\n" in text
    assert is_edited(run_dir) is True


def test_recipe_toml_is_the_source_not_an_edit(tmp_path, capsys):
    """Editing recipe.toml changes what the render is compared against: the diff shows the
    rendered files that no longer match, never recipe.toml itself."""
    out = render(RECIPES / "sft-debug.toml", run_dir=tmp_path / "run")
    edit(out.run_dir / "recipe.toml", 'name = "sft-debug"', 'name = "sft-debug" # a comment')
    assert diff(out.run_dir, capsys)[0] == 0


def test_a_preflight_run_dir_renders_as_a_preflight(tmp_path, capsys):
    out = render(RECIPES / "rl-debug.toml", run_dir=tmp_path / "run", preflight=True)
    assert diff(out.run_dir, capsys)[0] == 0
    (out.run_dir / "plan.json").write_text("{ edited past reading")
    rc, text = diff(out.run_dir, capsys)
    assert rc == 1 and "\n+{ edited past reading\n" in text and "job.sbatch" not in text
