"""`slurmrl submit RECIPE --join RUN_DIR`: a second job whose vLLM servers join the running RL job of RUN_DIR.

Every check runs before anything is written: RUN_DIR is an RL run dir (not SFT; its weights go through the
filesystem: a broadcast's transfer group holds the job's planned servers only), its last job is running (it has its secret), and RECIPE
serves the same model under the same name. The joiner job (``slurmrl.plan.join``) is rendered into a run dir of
its own beside the recipe's, ``<main>-join`` (``-2``, ``-3``, ... when taken), holding a copy of the main run
dir's secret (mode 0600), and submitted as any run dir is; its servers register in RUN_DIR once ready.
"""

from __future__ import annotations

from pathlib import Path

from slurmrl.app.build import build_recipe
from slurmrl.app.plan import resolve_run_dir, warn
from slurmrl.contract.weight_sync import Broadcast
from slurmrl.errors import UserError
from slurmrl.plan.join import joiner
from slurmrl.recipe.load import load_recipe
from slurmrl.recipe.recipe import Recipe
from slurmrl.rundir import jobs
from slurmrl.rundir.atomic import missing_folders, write_text
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.write import write_run_dir
from slurmrl.slurm import fit
from slurmrl.slurm.script import read_groups
from slurmrl.slurm.watch import Watch

FIELD = "--join"


def main_recipe(main: Path) -> Recipe:
    """The recipe RUN_DIR was rendered from; refused unless it is an RL job's whose weights go through files."""
    paths = RunDir(main)
    if not (paths.recipe.is_file() and paths.script.is_file()):
        raise UserError(FIELD, f"{main} is not a run dir (no recipe.toml and job.sbatch in it)")
    r = load_recipe(paths.recipe)
    if r.kind != "rl":
        raise UserError(FIELD, f"{main} is a run dir of kind {r.kind!r}: servers join an RL job (kind 'rl')")
    if r.trainer is not None and isinstance(r.trainer.sync, Broadcast):
        raise UserError(FIELD, f"{main} syncs weights by {r.trainer.weight_sync}: a joiner job's servers start without "
                               "the weight-transfer engine its group needs; servers join a job whose "
                               "trainer.weight_sync is 'filesystem'")
    return r


def check_running(main: Path) -> None:
    """RUN_DIR's last job runs (and so has made its secret)."""
    previous = jobs.history(main)
    if not previous:
        raise UserError(FIELD, f"{main} was never submitted: submit it first")
    job_id = previous[-1].job_id
    snap = Watch(job_id).snapshot()
    if snap.state != "RUNNING" or not RunDir(main).secret.is_file():
        raise UserError(FIELD, f"job {job_id} of {main} is {snap.state}, not running: servers join a running job")


def same_model(r: Recipe, main: Recipe) -> None:
    for what, mine, theirs in (("model.path", r.model.path, main.model.path),
                               ("model.served_name", r.model.served_model_name, main.model.served_model_name)):
        if mine != theirs:
            raise UserError(what, f"is {mine!r}, but the job it joins serves {theirs!r}: joiners serve the same model")


def free_run_dir(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``, ... whichever does not exist yet."""
    n, path = 1, base
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def render_joiner(target: str, overrides: list[str], run_dir: str, place) -> tuple[Path, list[Path]]:
    """Check, then write the joiner run dir with the main job's secret; it and the folders this call made
    (`slurmrl.app.submit.submit_join` submits it, and removes them when sbatch refuses)."""
    path = Path(target)
    if path.suffix != ".toml" or not path.is_file():
        raise UserError(target, "with --join, give the joiner's recipe (.toml)")
    main = Path(run_dir).resolve()
    if not main.is_dir():
        raise UserError(FIELD, f"{run_dir}: no such run dir")
    recipe = load_recipe(path, overrides)
    r_main = main_recipe(main)
    same_model(recipe, r_main)
    check_running(main)
    r = joiner(recipe, r_main.name)
    out_dir = free_run_dir(resolve_run_dir(r))
    out = build_recipe(r, path, out_dir, place=place, join=str(main))
    warn(out.plan.warnings)
    fit.check(read_groups(out.script, str(RunDir(out_dir).script)), [g.name for g in out.plan.groups])
    fresh = missing_folders(out_dir)
    write_run_dir(out_dir, out.files)
    write_text(RunDir(out_dir).secret, RunDir(main).secret.read_text())  # the main job's, mode 0600
    return out_dir, fresh
