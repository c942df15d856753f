"""No edit lost: `slurmrl render` over a run dir with hand edits refuses (exit 2, one line naming
the edited files) unless --force; files nobody edited are rendered again. And the helper file
job.sbatch sources is part of what the job reads: lock.toml hashes it, `slurmrl diff` names an edit."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from slurmrl import cli

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "rl-debug.toml"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = cli.main(list(argv))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def render(capsys, run_dir: Path, *extra: str) -> tuple[int, str, str]:
    return run(capsys, "render", str(RECIPE), "--run-dir", str(run_dir), *extra)


def tree(run_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


EDITS = {
    "job.sbatch": lambda t: t.replace("--dtype float32", "--dtype bfloat16"),
    "slurmrl-functions.sh": lambda t: t.replace("sleep 1\n", "sleep 2\n", 1),
    "plan.json": lambda t: t.replace('"name"', '"name" ', 1),
    "components/trainer.toml": lambda t: t + "# mine\n",
}


@pytest.mark.parametrize("edited", [[k] for k in EDITS] + [sorted(EDITS)], ids=[*EDITS, "all"])
def test_a_render_over_hand_edits_refuses_naming_them_and_force_renders(edited, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert render(capsys, run_dir)[0] == 0
    for rel in edited:
        path = run_dir / rel
        new = EDITS[rel](path.read_text())
        assert new != path.read_text()
        path.write_text(new)
    before = tree(run_dir)
    rc, out, err = render(capsys, run_dir)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    for rel in edited:
        assert rel in err
    for rel in set(EDITS) - set(edited):
        assert f" {rel}," not in err and f" {rel} " not in err
    assert "--force" in err
    assert tree(run_dir) == before  # nothing half-written
    # `slurmrl diff` names the same files
    rc, out, _ = run(capsys, "diff", str(run_dir))
    assert rc == 1
    for rel in edited:
        assert f"+++ {run_dir / rel}\n" in out
    # --force renders over them
    assert render(capsys, run_dir, "--force")[0] == 0
    assert run(capsys, "diff", str(run_dir))[0] == 0


def test_an_unedited_run_dir_renders_again_also_with_another_recipe(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert render(capsys, run_dir)[0] == 0
    (run_dir / "logs" / "mine.log").write_text("kept\n")
    assert render(capsys, run_dir)[0] == 0
    rc, _, err = render(capsys, run_dir, "--set", "inference.startup_timeout=700")
    assert rc == 0, err
    assert "wait_ready inference 700" in (run_dir / "job.sbatch").read_text()
    assert (run_dir / "logs" / "mine.log").read_text() == "kept\n"


def test_an_extra_file_in_components_is_an_edit(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert render(capsys, run_dir)[0] == 0
    (run_dir / "components" / "notes.toml").write_text("x = 1\n")
    rc, _, err = render(capsys, run_dir)
    assert rc == 2 and "components/notes.toml" in err


def test_without_a_lock_the_run_dirs_own_recipe_says_what_was_rendered(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert render(capsys, run_dir)[0] == 0
    (run_dir / "lock.toml").unlink()
    assert render(capsys, run_dir, "--set", "inference.startup_timeout=700")[0] == 0  # nothing edited
    (run_dir / "lock.toml").unlink()
    script = run_dir / "job.sbatch"
    script.write_text(script.read_text() + "# mine\n")
    rc, _, err = render(capsys, run_dir)
    assert rc == 2 and "job.sbatch" in err


def test_the_lock_hashes_the_helper_file_and_diff_names_an_edit_to_it(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert render(capsys, run_dir)[0] == 0
    helper = run_dir / "slurmrl-functions.sh"
    lock = tomllib.loads((run_dir / "lock.toml").read_text())["lock"]
    assert "slurmrl-functions.sh" in lock["files"]
    assert 'source -- "${RUN_DIR}/slurmrl-functions.sh" 2' in (run_dir / "job.sbatch").read_text()
    helper.write_text(helper.read_text().replace("sleep 1\n", "sleep 5\n", 1))
    rc, out, _ = run(capsys, "diff", str(run_dir))
    assert rc == 1
    assert out.startswith(f"--- {helper} (rendered from recipe.toml)\n+++ {helper}\n")
    assert "\n-        sleep 1\n+        sleep 5\n" in out
    helper.unlink()
    rc, out, _ = run(capsys, "diff", str(run_dir))
    assert rc == 1 and str(helper) in out
