"""`slurmrl submit --again RUN_DIR`: a new run dir that runs what RUN_DIR ran.

Its lock (recipe.toml) is rendered for the new path, with every hand edit of the old run dir's
job files carried over, and the two are linked (RUN_DIR/links.json, both ways). Everything is
checked before anything is written; the new run dir is written whole or not at all. The nodes the
old run dir excluded are excluded events of the new one (its submit keeps them out)."""

from __future__ import annotations

from pathlib import Path

from slurmrl.app import diff
from slurmrl.app.build import build
from slurmrl.contract import events
from slurmrl.contract.events import Event
from slurmrl.errors import UserError
from slurmrl.plan.stored import is_preflight, load_plan
from slurmrl.rundir import jobs, lockfile
from slurmrl.rundir.links import Links, add_link, links_text, read_links
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_text
from slurmrl.rundir.write import write_run_dir
from slurmrl.runtime.steps.attempts import excluded_nodes


def next_run_dir(old: Path) -> Path:
    """RUN_DIR-again-N, the first N from 1 that is free."""
    n = 1
    while (old.parent / f"{old.name}-again-{n}").exists():
        n += 1
    return old.parent / f"{old.name}-again-{n}"


def again(target: str, new: str | None = None) -> Path:
    """Write a new run dir that runs what RUN_DIR ran: its lock (recipe.toml) rendered for the new
    path, with every hand edit of the old run dir's job files carried over (the old path replaced
    by the new one). Returns the new run dir; nothing is written when anything is wrong."""
    old = jobs.run_dir_arg(target)
    paths = RunDir(old)
    if not paths.recipe.is_file():
        raise UserError(str(old), f"has no {RunDir.RECIPE} to render again from")
    new_dir = Path(new).resolve() if new else next_run_dir(old)
    if new_dir.exists():
        raise UserError(str(new_dir), "exists; choose another run dir")
    read_links(old)  # a links file that cannot be updated afterwards is refused now, before writing
    lock = lockfile.read_lock(old)
    plan = load_plan(old)
    preflight = bool(plan and is_preflight(plan))
    source = lock.recipe_file or lockfile.header_source(read_text(paths.script)) or RunDir.RECIPE
    fresh = build(paths.recipe, run_dir=new_dir, preflight=preflight, source_name=source).files
    files = {rel: text for rel, text in fresh.items() if rel != RunDir.RECIPE}
    before, after = str(old), str(new_dir)
    for e in diff.edits(old):
        if e.rendered is not None and files.get(e.path) != e.rendered.replace(before, after):
            raise UserError(str(old), f"its hand edits cannot be carried to {new_dir}: {e.path} does not name the "
                                      "run dir verbatim; render its recipe.toml with --run-dir and edit again")
        if e.current is None:
            files.pop(e.path, None)
        else:
            files[e.path] = e.current.replace(before, after)
    files[RunDir.RECIPE] = read_text(paths.recipe)
    files[RunDir.LOCK] = lockfile.compose(files[RunDir.RECIPE], files, new_dir, source=source, preflight=preflight,
                                          previous=lock.table, again_of=str(old), sweep=None, sweep_point=None)
    files[RunDir.LINKS] = links_text(Links(again_of=str(old)))
    write_run_dir(new_dir, files)
    for node, reason in excluded_nodes(old).items():  # kept out here too: submit excludes them
        events.append(RunDir(new_dir).events, Event(kind="excluded", component="job", node=node,
                                                     cause=f"{reason} (excluded in {old})"))
    add_link(old, "again_as", str(new_dir))
    return new_dir
