"""`slurmrl submit`: render (for a recipe), check the cluster can hold every het group, sbatch,
record the job in jobs.json."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from slurmrl.app.again import again, next_run_dir
from slurmrl.app.build import build
from slurmrl.app.cluster import on_cluster
from slurmrl.app.diff import is_edited
from slurmrl.app.keep_edits import refuse_lost_edits
from slurmrl.app.plan import resolve_run_dir, warn
from slurmrl.app.preflight import wait_and_check
from slurmrl.errors import UserError
from slurmrl.plan.stored import is_preflight, load_plan
from slurmrl.rundir import jobs, lockfile
from slurmrl.rundir.links import read_links
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_text
from slurmrl.rundir.write import write_run_dir
from slurmrl.slurm import fit, tools, topology
from slurmrl.slurm.sbatch import sbatch
from slurmrl.slurm.script import read_groups
from slurmrl.slurm.watch import Watch


@dataclass(frozen=True)
class Submitted:
    run_dir: Path
    job_id: str
    edited: bool


def classify(target: str) -> tuple[str, Path]:
    """``recipe`` (a .toml file) or ``run_dir`` (a run dir or its job.sbatch)."""
    path = Path(target)
    if path.is_dir():
        return "run_dir", jobs.run_dir_arg(target)
    if not path.exists():
        raise UserError(target, "no such recipe, run dir or job script")
    if path.suffix == ".toml":
        return "recipe", path
    if path.suffix == ".sbatch" or path.name == RunDir.JOBS:
        return "run_dir", jobs.run_dir_arg(target)
    raise UserError(target, "give a recipe (.toml), a run dir, or a run dir's job.sbatch")


def group_names(run_dir: Path) -> list[str] | None:
    plan = load_plan(run_dir)
    return [g.name for g in plan.groups] if plan else None


def check_not_running(run_dir: Path) -> None:
    previous = jobs.history(run_dir)
    if not previous:
        return
    job_id = previous[-1].job_id
    snap = Watch(job_id).snapshot()
    if snap.in_queue and not snap.done:
        raise UserError(str(run_dir), f"job {job_id} from this run dir is still {snap.state}; "
                                      f"`slurmrl cancel {run_dir}` first, or wait for it")


def set_aside(run_dir: Path) -> None:
    """Move the last job's logs, ready files and probe reports into logs/job-<id>/ (kept, out of
    the way), so the new job's attempt-0 starts empty and `status`/`logs` show only the new job."""
    previous = jobs.history(run_dir)
    if not previous:
        return
    paths = RunDir(run_dir)
    dest = paths.set_aside_dir(previous[-1].job_id)
    moved = [*paths.logs.glob("attempt-*"), *paths.job_outputs()]
    for src in moved:
        if src.exists():
            dest.mkdir(parents=True, exist_ok=True, mode=0o700)
            target = dest / src.name
            if target.exists():
                shutil.rmtree(target)
            src.rename(target)


def submit(target: str, overrides: list[str], force: bool, preflight: bool) -> Submitted:
    where = tools.transport()  # this machine, or --cluster NAME's (slurmrl.remote)
    kind, path = classify(target)
    if kind == "recipe":
        out = build(path, overrides, preflight=preflight, place=where.place)  # rendered for where it runs
        warn(out.plan.warnings)
        run_dir = resolve_run_dir(out.recipe, preflight)
        fit.check(read_groups(out.script, str(RunDir(run_dir).script)), [g.name for g in out.plan.groups])
        topology.refuse_unsupported(out.script)  # e.g. --segment where this cluster's sbatch lacks it
        if RunDir(run_dir).jobs.exists():
            check_not_running(run_dir)
        fresh = not run_dir.exists()
        if not force:
            refuse_lost_edits(run_dir, out.files, build)  # a rendered run dir's hand edits are not dropped
        write_run_dir(run_dir, out.files, force=force)  # refuses over a submitted run dir without --force
        edited = False
    else:
        run_dir = path
        if overrides:
            raise UserError("--set", "applies to a recipe; this is a run dir (edit its job.sbatch, or submit the recipe)")
        plan = load_plan(run_dir)
        if preflight and not (plan and is_preflight(plan)):
            raise UserError("--preflight", f"{run_dir} is not a preflight run dir; give the recipe instead")
        script = RunDir(run_dir).script
        text = read_text(script)
        fit.check(read_groups(text, str(script)), group_names(run_dir))
        topology.refuse_unsupported(text)
        check_not_running(run_dir)
        edited = is_edited(run_dir)
        fresh = False
    try:
        return send(where, run_dir, edited, recipe_path=path if kind == "recipe" else None)
    except BaseException:
        if fresh and not RunDir(run_dir).jobs.exists():  # this call wrote it, and nothing runs from it
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def send(where, run_dir: Path, edited: bool, recipe_path: Path | None) -> Submitted:
    """Lock, set the last job's outputs aside, sbatch, record: after every check has passed."""
    where.pull(run_dir)  # on a cluster: the last job's outputs first, so they are set aside there too
    lockfile.refresh(run_dir, edited, recipe_path=recipe_path)  # hashes as submitted
    set_aside(run_dir)
    where.push(run_dir)
    script = RunDir(run_dir).script
    job_id = sbatch([str(RunDir(where.place(run_dir)).script)])
    jobs.record(run_dir, job_id, jobs.sha256(script), edited, cluster=where.name)
    where.push(run_dir, [RunDir.JOBS])
    return Submitted(run_dir, job_id, edited)


def announce(s: Submitted) -> None:
    note = " (job.sbatch edited by hand: submitted as it is)" if s.edited else ""
    where = tools.transport()
    on = f" to cluster {where.name} (it runs in {where.place(s.run_dir)})" if where.name else ""
    print(f"submitted job {s.job_id}{on} from {s.run_dir}{note}")
    print(f"  slurmrl status {s.run_dir} --watch")
    print(f"  slurmrl logs {s.run_dir} -f")
    print(f"  slurmrl cancel {s.run_dir}")


def submit_again(target: str, preflight: bool) -> Submitted:
    """`submit --again RUN_DIR`: the new run dir RUN_DIR-again-N is rendered and linked from the old
    one, then submitted; when anything refuses (the cluster cannot hold it, sbatch fails), the new
    run dir is removed and the old one's links.json put back as it was: nothing is left behind."""
    old = jobs.run_dir_arg(target)
    links = RunDir(old).links
    read_links(old)  # the new run dir is linked from it: a bad links.json is refused before anything is written
    before = links.read_bytes() if links.is_file() else None
    new = next_run_dir(old)  # free now: whatever is there after a refusal, this call wrote
    try:
        again(str(old), str(new))
        s = submit(str(new), [], False, preflight)
    except BaseException:
        if RunDir(new).jobs.exists():  # sbatch took it: the run dir is the job's now
            raise
        shutil.rmtree(new, ignore_errors=True)
        if before is None:
            links.unlink(missing_ok=True)
        else:
            links.write_bytes(before)
        raise
    print(f"{new}: {target} again (rendered from its lock, hand edits carried over)")
    return s


def cmd_submit(args) -> int:
    with on_cluster(args):
        if args.again:
            if args.overrides:
                raise UserError("--set", "with --again, edit the run dir (or its lock.toml) instead")
            s = submit_again(args.recipe, args.preflight)
        else:
            s = submit(args.recipe, args.overrides, args.force, args.preflight)
        announce(s)
        if not args.preflight:
            return 0
        print(f"preflight: waiting up to {args.timeout:.0f}s for job {s.job_id} to end", flush=True)
        return wait_and_check(s.run_dir, s.job_id, args.timeout)
