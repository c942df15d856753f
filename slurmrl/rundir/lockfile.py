"""RUN_DIR/lock.toml: the run as a complete recipe, plus where it came from.

The lock is a recipe: the resolved recipe (recipe.toml: overrides applied, every default filled
in; ``output_dir`` made absolute) followed by a ``[lock]`` table of provenance that rendering never
reads (``slurmrl.recipe.load`` sets it aside):

- ``run_dir``, ``recipe_file`` (the name job.sbatch's header gives), ``preflight``: with these,
  rendering the lock (``build(lock, run_dir=..., source_name=...)``, or ``slurmrl render lock.toml``)
  writes job.sbatch, plan.json and components/ byte for byte as they were rendered;
- slurmrl's version and the git commit (and dirty state) of its source, when it runs from a checkout;
- ``[lock.recipe_repo]``: the git commit and dirty state of the repository the recipe file is in;
- ``[lock.container]``: the image, and its digest where one is known (a ``@sha256:`` reference, or
  the sha256 of a local squashfs file; enroot keeps none for an image imported by tag);
- ``[lock.files]``: sha256 of job.sbatch and every file it reads in the run dir (plan.json,
  components/*.toml), as submitted (``edited``: they differ from a fresh render of recipe.toml);
  ``[lock.inputs]``: the same for files outside it the job reads (``trainer.dataset``, Dynamo
  engine configs);
- ``[[lock.runtime]]``: appended by the job itself (``slurmrl.runtime.steps.provenance``, from each
  component's first task): the interpreter's Python, vLLM, torch and transformers versions, host,
  attempt, job id, and the container's environment markers.

``slurmrl submit --again RUN_DIR`` (``slurmrl.app.again``) renders the lock for a new run dir.

A leaf (standard library and errors only): ``slurmrl.recipe.load`` imports this module. Every
value read back from a lock is checked here (:func:`read_lock`): a string that may reach a
rendered job.sbatch is one line.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir import tomlw
from slurmrl.rundir.atomic import write_text
from slurmrl.rundir.jobs import history
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import kind, open_file, read_bytes, read_json, read_text, read_toml
from slurmrl.rundir.text import is_one_line
from slurmrl.rundir.undo import Changes

FORMAT = 1  # [lock] format: a [lock] table without it is refused in a recipe
HASH_CAP_BYTES = 1 << 30  # files larger than this (a container image, a big dataset) get size and mtime only
GIT_TIMEOUT_S = 10
HEADER = re.compile(r"^# slurmrl job .* rendered from (?P<file>.+)\.$", re.M)
INPUT_FIELDS = (("trainer", "dataset"), ("inference", "dynamo", "engine_config"),
                ("inference", "dynamo", "prefill_engine_config"), ("inference", "dynamo", "decode_engine_config"))


# ---- reading ----------------------------------------------------------------------------
def check_table(table) -> None:
    """A recipe may carry a [lock] table only as slurmrl writes it (provenance, never read as a knob)."""
    if not (isinstance(table, dict) and table.get("format") == FORMAT):
        raise UserError("lock", f"is the provenance table slurmrl writes into a run dir's {RunDir.LOCK} "
                                f"(format = {FORMAT}); it is not a setting: remove it from the recipe")


def read(path: Path) -> dict | None:
    """The whole lock file as data, or None when there is none (or it does not parse)."""
    try:
        return read_toml(path, missing=None)
    except UserError:
        return None


@dataclass(frozen=True)
class Lock:
    """RUN_DIR/lock.toml's [lock] table, checked. ``table``: all of it, for the next lock's ``previous``."""

    recipe_file: str | None = None
    run_dir: str | None = None
    preflight: bool = False
    again_of: str | None = None
    sweep: str | None = None
    sweep_point: int | None = None
    table: dict = field(default_factory=dict)


ONE_LINE_KEYS = ("recipe_file", "run_dir", "recipe_path", "again_of", "sweep")


def read_lock(run_dir: Path) -> Lock:
    """RUN_DIR/lock.toml's provenance (an empty Lock when there is none); a hand-edited lock whose
    values cannot be what slurmrl wrote is one line naming the file."""
    path = RunDir(run_dir).lock
    data = read_toml(path, missing=None)
    if data is None:
        return Lock()
    table = data.get("lock", {})
    if not isinstance(table, dict):
        raise UserError(str(path), f"[lock] should be a table, not {kind(table)}")
    for key in ONE_LINE_KEYS:
        value = table.get(key)
        if value is not None and not (isinstance(value, str) and value and is_one_line(value)):
            raise UserError(f"{path} [lock] {key}", f"should be one line of text, not {kind(value) if not isinstance(value, str) else repr(value[:40])}")
    preflight = table.get("preflight", False)
    if not isinstance(preflight, bool):
        raise UserError(f"{path} [lock] preflight", f"should be true or false, not {kind(preflight)}")
    point = table.get("sweep_point")
    if point is not None and (isinstance(point, bool) or not isinstance(point, int) or not 0 <= point < 1 << 31):
        raise UserError(f"{path} [lock] sweep_point", "should be a point's index (a whole number from 0)")
    return Lock(table.get("recipe_file"), table.get("run_dir"), preflight, table.get("again_of"),
                table.get("sweep"), point, table)


def meta(run_dir: Path) -> dict:
    """RUN_DIR/lock.toml's [lock] table, checked ({} when there is none)."""
    return read_lock(run_dir).table


def recorded_source(recipe_path: Path) -> str | None:
    """The recipe file a lock's job.sbatch names in its header (None: not a lock)."""
    try:
        text = read_bytes(recipe_path).decode("utf-8", errors="replace")
    except UserError:
        return None
    if not re.search(r"^\[lock\]\s*$", text, re.M):
        return None
    data = read(Path(recipe_path)) or {}
    table = data.get("lock")
    source = table.get("recipe_file") if isinstance(table, dict) else None
    return source if isinstance(source, str) and source and is_one_line(source) else None


def script_run_dir(script_text: str) -> Path | None:
    """The run dir job.sbatch names (``RUN_DIR=...``; on a remote cluster, its path there)."""
    m = re.search(r"^RUN_DIR=(.+)$", script_text, re.M)
    try:
        words = shlex.split(m[1], comments=True) if m else []
    except ValueError:
        return None
    return Path(words[0]) if len(words) == 1 and is_one_line(words[0]) else None


def header_source(script_text: str) -> str | None:
    m = HEADER.search("\n".join(script_text.splitlines()[:3]))
    return m["file"] if m and is_one_line(m["file"]) else None


# ---- provenance ---------------------------------------------------------------------------
def sha256_file(path: Path) -> str | dict:
    """sha256 of a file; size and mtime only above HASH_CAP_BYTES."""
    st = path.stat()
    if st.st_size > HASH_CAP_BYTES:
        return {"size": st.st_size, "mtime": int(st.st_mtime),
                "sha256": f"not computed: larger than {HASH_CAP_BYTES >> 30} GiB"}
    h = hashlib.sha256()
    with open_file(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_state(path: Path) -> dict | None:
    """{root, commit, dirty} of the git work tree holding ``path``; None outside one (or without git)."""
    where = path if path.is_dir() else path.parent

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    root = git("rev-parse", "--show-toplevel")
    commit = git("rev-parse", "HEAD") if root else None
    if not commit:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no")
    return {"root": root, "commit": commit, "dirty": bool(changed)}


def slurmrl_state() -> dict:
    try:
        out = {"version": version("slurmrl")}
    except PackageNotFoundError:
        out = {"version": "unknown"}
    state = git_state(Path(__file__).resolve().parent)
    if state:
        out.update(commit=state["commit"], dirty=state["dirty"])
    return out


def container_state(recipe: dict) -> dict | None:
    """The image as the recipe names it, and its digest where one is known."""
    image = (recipe.get("container") or {}).get("image")
    if not image:
        return None
    out = {"image": image}
    if "@sha256:" in image:
        out["digest"] = "sha256:" + image.rsplit("@sha256:", 1)[1]
    elif Path(image).is_file():
        digest = sha256_file(Path(image))
        out["digest"] = f"sha256:{digest}" if isinstance(digest, str) else digest
    else:
        out["digest"] = "unknown: enroot imports a registry image by tag and keeps no digest; pin image@sha256:..."
    return out


def inputs(recipe: dict) -> dict:
    """sha256 of files outside the run dir that the job reads and that exist here."""
    out: dict[str, str | dict] = {}
    for keys in INPUT_FIELDS:
        node: object = recipe
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, str) and node and Path(node).is_file():
            out[str(Path(node).resolve())] = sha256_file(Path(node))
    return out


def job_files(run_dir: Path) -> dict[str, str]:
    """Relative path -> text of job.sbatch and everything it reads in the run dir."""
    run_dir = Path(run_dir)
    out = {}
    rels = [RunDir.SCRIPT, RunDir.FUNCTIONS, RunDir.PLAN]
    rels += [f"{RunDir.COMPONENTS}/{p.name}" for p in sorted((run_dir / RunDir.COMPONENTS).glob("*.toml"))]
    for rel in rels:
        data = read_bytes(run_dir / rel, missing=None)
        if data is not None:
            out[rel] = data.decode("utf-8", errors="replace")
    return out


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---- writing --------------------------------------------------------------------------------
def compose(recipe_toml: str, files: dict[str, str], run_dir: Path, *, source: str, preflight: bool,
            recipe_path: Path | None = None, edited: bool | None = None, previous: dict | None = None,
            **links) -> str:
    """The lock's text: ``recipe_toml`` (the resolved recipe) and a [lock] table.

    ``files``: the run dir's files the job reads (relative path -> text, recipe.toml and lock.toml
    left out); ``previous``: the [lock] table this one replaces (what cannot be found again, such
    as the recipe's repository, is kept from it); ``links``: again_of, sweep, ..."""
    recipe = tomllib.loads(recipe_toml)
    recipe.pop("lock", None)
    run_dir = Path(run_dir)
    if recipe.get("name") == (run_dir.name.removesuffix("-preflight") if preflight else run_dir.name):
        recipe["output_dir"] = str(run_dir.parent)  # resolved: `slurmrl render lock.toml` finds the run dir again
    previous = previous or {}
    table: dict = {
        "format": FORMAT,
        "run_dir": str(run_dir),
        "recipe_file": source,
        "preflight": preflight,
        "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "slurmrl": slurmrl_state(),
    }
    if recipe_path is not None:
        table["recipe_path"] = str(Path(recipe_path).resolve())
        repo = git_state(Path(recipe_path).resolve())
        table["recipe_repo"] = repo if repo else {"note": "the recipe file is not in a git work tree"}
    else:
        for key in ("recipe_path", "recipe_repo"):
            if key in previous:
                table[key] = previous[key]
    for key in ("again_of", "sweep", "sweep_point"):
        value = links.get(key, previous.get(key))
        if value is not None:
            table[key] = value
    container = container_state(recipe)
    if container:
        table["container"] = container
    if edited is not None:
        table["edited"] = edited
    table["files"] = {rel: digest(text) for rel, text in sorted(files.items())
                      if rel not in (RunDir.RECIPE, RunDir.LOCK)}
    found = inputs(recipe)
    if found:
        table["inputs"] = found
    head = (f"# slurmrl lock of {run_dir}: the recipe as resolved (every default filled in) and, in [lock],\n"
            "# where it came from. It is a recipe: `slurmrl render lock.toml --run-dir RUN_DIR` renders the\n"
            "# same job.sbatch; `slurmrl submit --again RUN_DIR` submits the run again as a new run dir.\n"
            "# The job appends [[lock.runtime]]: the versions its interpreter reports.\n")
    return head + tomlw.dumps(recipe) + "\n" + tomlw.dumps({"lock": table})


def refresh(run_dir: Path, edited: bool, recipe_path: Path | None = None, changes: Changes | None = None) -> None:
    """Rewrite RUN_DIR/lock.toml as the run dir is now, before it is submitted (hashes of the files
    as they go to sbatch, hand edits included). An earlier job's [[lock.runtime]] entries stay in
    the copy kept with its logs (logs/job-<id>/lock.toml). ``recipe_path``: the recipe file it was
    just rendered from (its repository's git state is taken again), else kept from the old lock.
    ``changes``: where every file written is recorded, to be put back if the submission fails."""
    changes = changes or Changes()
    run_dir = Path(run_dir)
    resolved = RunDir(run_dir).recipe
    if not resolved.is_file():
        return  # a run dir made by hand: nothing to lock
    lock_path = RunDir(run_dir).lock
    old = read(lock_path) or {}
    lock = old.get("lock")
    previous: dict = lock if isinstance(lock, dict) else {}
    jobs = history(run_dir)
    if previous.get("runtime") and jobs:
        keep = RunDir(run_dir).set_aside_dir(jobs[-1].job_id)
        changes.folders(keep)
        keep.mkdir(parents=True, exist_ok=True, mode=0o700)
        changes.file(keep / RunDir.LOCK)
        shutil.copy2(lock_path, keep / RunDir.LOCK)
    files = job_files(run_dir)
    script = files.get(RunDir.SCRIPT, "")
    plan = _read_json(RunDir(run_dir).plan)
    text = compose(read_text(resolved), files, script_run_dir(script) or run_dir,
                   source=header_source(script) or previous.get("recipe_file") or RunDir.RECIPE,
                   preflight=bool(plan.get("preflight")) if isinstance(plan, dict) else bool(previous.get("preflight")),
                   recipe_path=recipe_path, edited=edited, previous=previous)
    changes.file(lock_path)
    write_text(lock_path, text)


def _read_json(path: Path):
    try:
        return read_json(path, missing=None)
    except UserError:
        return None
