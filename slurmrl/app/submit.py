"""`slurmrl submit`: render (for a recipe), check the cluster can hold every het group, sbatch,
record the job in jobs.json."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from slurmrl.app.again import again, next_run_dir
from slurmrl.app.build import build
from slurmrl.app.cluster import on_cluster
from slurmrl.app.diff import is_edited
from slurmrl.app.join import render_joiner
from slurmrl.app.keep_edits import refuse_lost_edits
from slurmrl.app.plan import resolve_run_dir, warn
from slurmrl.app.preflight import wait_and_check
from slurmrl.errors import UserError
from slurmrl.plan.stored import is_preflight, load_plan
from slurmrl.rundir import jobs, lockfile
from slurmrl.rundir.atomic import missing_folders, remove_empty
from slurmrl.rundir.links import read_links
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_text
from slurmrl.rundir.undo import Changes
from slurmrl.rundir.write import write_run_dir
from slurmrl.runtime.steps.attempts import excluded_nodes
from slurmrl.slurm import exclusion, fit, tools, topology
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


def check_in_place(run_dir: Path, script_text: str, placed: Path) -> None:
    """A run dir is rendered for where it is: job.sbatch's ``#SBATCH --output`` and ``RUN_DIR`` name it.
    One moved (or copied) elsewhere would write into the old place: refused, to be rendered again here
    (a re-render would drop the hand edits of job.sbatch that submitting a run dir is for)."""
    named = lockfile.script_run_dir(script_text)
    if named is not None and named != Path(placed) and named.resolve() != Path(placed).resolve():
        raise UserError(str(run_dir), f"was rendered for {named} (job.sbatch writes there); render it again here "
                                      f"(`slurmrl render RECIPE --run-dir {run_dir}`) or move it back")


def set_aside(run_dir: Path, changes: Changes) -> None:
    """Move the last job's logs, ready files and probe reports into logs/job-<id>/ (kept, out of
    the way), so the new job's attempt-0 starts empty and `status`/`logs` show only the new job.
    Every move is recorded in ``changes`` (a failed sbatch moves them back)."""
    previous = jobs.history(run_dir)
    if not previous:
        return
    paths = RunDir(run_dir)
    dest = paths.set_aside_dir(previous[-1].job_id)
    moved = [*paths.logs.glob("attempt-*"), *paths.job_outputs()]
    for src in moved:
        if src.exists():
            changes.folders(dest)
            dest.mkdir(parents=True, exist_ok=True, mode=0o700)
            changes.rename(src, dest / src.name)


def submit(target: str, overrides: list[str], force: bool, preflight: bool) -> Submitted:
    where = tools.transport()  # this machine, or --cluster NAME's (slurmrl.remote)
    kind, path = classify(target)
    changes = Changes()  # everything written before sbatch, put back when it fails
    if kind == "recipe":
        out = build(path, overrides, preflight=preflight, place=where.place)  # rendered for where it runs
        warn(out.plan.warnings)
        run_dir = resolve_run_dir(out.recipe, preflight)
        fit.check(read_groups(out.script, str(RunDir(run_dir).script)), [g.name for g in out.plan.groups])
        topology.refuse_unsupported(out.script)  # e.g. --segment where this cluster's sbatch lacks it
        if RunDir(run_dir).jobs.exists():
            check_not_running(run_dir)
        fresh = missing_folders(run_dir)  # the run dir, and its parents, when this call makes them
        if not force:
            refuse_lost_edits(run_dir, out.files, build)  # a rendered run dir's hand edits are not dropped
        changes.tree(run_dir, {rel.split("/")[0] for rel in out.files})  # a failed sbatch: the render undone
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
        check_in_place(run_dir, text, where.place(run_dir))
        edited = is_edited(run_dir)
        fresh = []
    try:
        return send(where, run_dir, edited, recipe_path=path if kind == "recipe" else None, changes=changes)
    except BaseException:
        changes.rollback()  # the render over an existing run dir (send puts back the rest)
        if fresh and not RunDir(run_dir).jobs.exists():  # this call wrote it, and nothing runs from it
            shutil.rmtree(run_dir, ignore_errors=True)
            remove_empty(fresh)  # and the output folders it made for it
        raise


def send(where, run_dir: Path, edited: bool, recipe_path: Path | None, changes: Changes | None = None) -> Submitted:
    """Lock, set the last job's outputs aside, sbatch, record: after every check has passed. When sbatch
    fails, lock.toml, every file moved and what ``changes`` holds already (a render) are put back as
    they were (here and, on a cluster, there)."""
    where.pull(run_dir)  # on a cluster: the last job's outputs first, so they are set aside there too
    changes = changes if changes is not None else Changes()
    try:
        lockfile.refresh(run_dir, edited, recipe_path=recipe_path, changes=changes)  # hashes as submitted
        kept_out = sorted(excluded_nodes(run_dir))  # nodes an earlier job of this run dir (or --again's) excluded,
        set_aside(run_dir, changes)  # read before its last job's notes are set aside
        where.push(run_dir)
        job_id = sbatch([*(["--hold"] if kept_out else []), str(RunDir(where.place(run_dir)).script)])
    except BaseException:
        changes.rollback()
        put_back(where, run_dir)
        raise
    changes.commit()
    script = RunDir(run_dir).script
    jobs.record(run_dir, job_id, jobs.sha256(script), edited, cluster=where.name)
    where.push(run_dir, [RunDir.JOBS])
    if kept_out:
        keep_out(job_id, kept_out)
    return Submitted(run_dir, job_id, edited)


def keep_out(job_id: str, nodes: list[str]) -> None:
    """The held job gets the run dir's excluded nodes, then is released (also when Slurm refused them)."""
    try:
        exclusion.exclude(job_id, nodes)
        print(f"excluded node(s) {','.join(nodes)}: this run dir's earlier jobs found them bad (`slurmrl status`)")
    except UserError as e:
        print(f"slurmrl: warning: job {job_id} runs without excluding {','.join(nodes)}: {e}", file=sys.stderr)
    exclusion.release(job_id)


def put_back(where, run_dir: Path) -> None:
    """After a rollback: the cluster's copy as the local one is again (nothing to do on this machine)."""
    if where.name:
        try:
            where.push(run_dir)
        except (UserError, OSError):
            pass  # the refusal that brought us here is the error to show


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


def submit_join(target: str, overrides: list[str], run_dir: str) -> Submitted:
    """`submit RECIPE --join RUN_DIR` (slurmrl.app.join): its joiner run dir, submitted; removed when sbatch refuses."""
    where = tools.transport()
    if where.name:
        raise UserError("--join", "joins a run dir of this machine's cluster (not with --cluster)")
    out_dir, fresh = render_joiner(target, overrides, run_dir, where.place)
    try:
        return send(where, out_dir, False, recipe_path=Path(target))
    except BaseException:
        if not RunDir(out_dir).jobs.exists():
            shutil.rmtree(out_dir, ignore_errors=True)
            remove_empty(fresh)
        raise


def cmd_submit(args) -> int:
    with on_cluster(args):
        if args.join:
            if args.again or args.preflight:
                raise UserError("--join", "submits a recipe's servers as they are: not with --again or --preflight")
            s = submit_join(args.recipe, args.overrides, args.join)
        elif args.again:
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
