"""The walk behind tests/test_no_silent_knobs.py (issue 15: every recipe field takes effect in every shape that
accepts it, or `plan` refuses it there with one line naming it); that file's docstring says how the walk
decides and what it found."""

from __future__ import annotations

import copy
import inspect
import re
import typing
from functools import cache
from pathlib import Path

import annotated_types
from pydantic import BaseModel, ValidationError
from recipe_leaves import _strip, leaves

from slurmrl import envs
from slurmrl.app.plan import planned
from slurmrl.envs.protocol import CHAT_ONLY, refuse_chat_only
from slurmrl.errors import UserError
from slurmrl.plan import plan, rules
from slurmrl.recipe.load import apply_overrides, check_numbers, format_validation_error, read_toml
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.schema import models
from slurmrl.render.script import render_script
from slurmrl.rundir import tomlw

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.toml"))
RUN_DIR = "/cluster/runs/knobs"  # planning is pure: the run dir is only a name here

# Fields whose effect is outside the run dir's files, each with the reason.
OUTSIDE_RUN_DIR = {
    # Where the run dir goes (<output_dir>/<name>/); no file inside it names its parent.
    "output_dir": "chooses the run dir's parent folder",
    # Another copy of the templates renders the same script until the copy is edited;
    # tests/test_cli.py renders with an ejected copy, tests/test_bad_recipes.py refuses a missing one.
    "templates_dir": "chooses the templates job.sbatch is rendered with",
}

# Capacities: what the cluster has, not what the job asks for. Where the recipe sizes every
# component itself they only bound those sizes (a smaller one is refused), so a larger value may
# change nothing; each must still take effect in some gallery recipe.
CAPACITIES = {
    "slurm.gpus_per_node": "GPUs on each node: the default for trainer/inference.gpus_per_node and their bound",
}

# Fields whose every other value needs other sections: refusals naming those sections answer for them.
REFUSED_AS = {"kind": set(rules.SECTIONS["rl"])}

# Keys of components/<component>.toml the program does not read for a recipe kind
# (slurmrl/runtime/trainer/loop.py: the SFT step has no clip or KL term, RL reads no dataset).
UNREAD = {
    ("trainer", "sft"): {"clip_eps", "clip_eps_high", "token_mask_low", "token_mask_high", "kl_coef"},
    ("trainer", "rl"): {"dataset"},
}

# Plausible values for fields a generic value does not fit (formats checked by the schema).
PLAUSIBLE: dict[str, list] = {
    "name": ["other-run"],
    "slurm.time": ["02:30:00", "45"],
    "slurm.max_total_time": ["3-00:00:00"],
    "sweep.grid": [{"trainer.lr": [1e-6, 3e-6]}],  # field path -> values (slurmrl sweep refuses a bad path)
    "slurm.signal": ["USR2@300"],
    "slurm.mem": ["200G", "0"],
    "slurm.extra_directives": [["--reservation=big"]],
    "trainer.lora.target_modules": [["q_proj", "v_proj"]],
    "slurm.mail_user": ["me@example.org"],
    "slurm.mail_type": ["END,FAIL", "ALL"],
    "slurm.dependency": ["afterok:1234"],
    "container.image": ["/images/other.sqsh"],
    "container.mounts": [["/scratch:/scratch"]],
    "container.env": [["HF_HOME"]],
    "python.venv": ["/opt/venvs/other"],
    "python.uv_project": ["/opt/project"],
    "python.modules": [["cuda/12.4"]],
    "python.setup": [["ulimit -n 65536"]],
    "python.executable": ["/usr/bin/python3.12"],
    "model.path": ["org/other-model", "/models/other"],
    "trainer.dataset": ["/data/other.jsonl"],
    "orchestrator.environment": [*envs.BUILTIN, "my_envs.countdown:Countdown"],
    "inference.kv_offload.disk_path": ["/local/kv"],
    "inference.kv_offload.mooncake_device": ["mlx5_1"],
}
ENV_VALUE = {"KNOB_TEST": "1"}
LIST_VALUE = ["--knob-test"]
TRIES = 6  # values tried per field before the walk gives up on finding one the schema accepts


# ---- the schema --------------------------------------------------------------------------------


def section_model(annotation, part: str | None = None) -> type[BaseModel] | None:
    """The section model a field holds (``X`` or ``X | None``), else None; of a union of sections
    (``inference``, one per backend), the first member that has field ``part``."""
    found = models(annotation)
    return next((m for m in found if part is None or part in m.model_fields), None)


def field_at(path: str, model: type[BaseModel] = Recipe):
    """The field at a dotted path; through a union of sections (``inference``), the first member
    that has the whole rest of the path (``inference.prefill.enable_dp_attention``: SGLang's role)."""
    part, _, rest = path.partition(".")
    f = model.model_fields[part]
    if not rest:
        return f
    for sub in models(f.annotation):
        try:
            return field_at(rest, sub)
        except KeyError:
            continue
    raise KeyError(path)


def bounds(f) -> tuple[float | None, float | None, bool, bool]:
    """(low, high, low is strict, high is strict) from ge/gt/le/lt."""
    lo = hi = None
    lo_strict = hi_strict = False
    _, meta = _strip(f.annotation)
    for m in [*f.metadata, *meta]:
        if isinstance(m, annotated_types.Ge):
            lo = m.ge
        elif isinstance(m, annotated_types.Gt):
            lo, lo_strict = m.gt, True
        elif isinstance(m, annotated_types.Le):
            hi = m.le
        elif isinstance(m, annotated_types.Lt):
            hi, hi_strict = m.lt, True
    return lo, hi, lo_strict, hi_strict


def default_of(f):
    """The field's default; None for a required field."""
    if f.is_required():
        return None
    return f.default_factory() if f.default_factory is not None else f.default


def candidates(path: str, f, current, recipe: Recipe) -> list:
    """Values to try for ``path``, most telling first; none equal to ``current``."""
    kinds, _ = _strip(f.annotation)
    kind = kinds[0] if kinds else None
    default = default_of(f)
    if path in PLAUSIBLE:
        vals = list(PLAUSIBLE[path])
    elif path == "orchestrator.environment_args":
        vals = [environment_args(recipe)]
    elif typing.get_origin(kind) is typing.Literal:
        choices = list(typing.get_args(kind))
        vals = [c for c in choices if c != default] + ([default] if default is not None else [])
    elif kind is bool:
        vals = [True, False] if current is None else [not current]
    elif kind in (int, float):
        vals = numbers(f, current, default, kind)
    elif kind is str:  # a word, else the shapes of text a validator may ask for
        vals = [f"{current}x" if current else "knob-test", "/knob/test", "http://knob-test:2379",
                "nats://knob-test:4222"]
    elif typing.get_origin(kind) is list:
        item, _ = _strip(typing.get_args(kind)[0])
        base = current if current is not None else default
        base = base if base is not None else [1]  # a list whose default is "decided by the shape"
        if item and item[0] is int:  # e.g. a grid of lengths: each value changed, or one more
            vals = [[v * 2 for v in base], [*base, max(base, default=0) * 2 + 1]]
        else:
            vals = [LIST_VALUE]
    elif typing.get_origin(kind) is dict:  # environment variables, else arguments by name
        vals = [ENV_VALUE, {"knob_test": "1"}]
    else:
        raise AssertionError(f"{path}: the walk has no value for {f.annotation}; add one to PLAUSIBLE")
    out = []
    for v in vals:
        if v != current and v not in out:
            out.append(v)
    return out


def numbers(f, current, default, kind) -> list:
    lo, hi, lo_strict, hi_strict = bounds(f)
    base = current if current is not None else default
    if base is None:
        base = lo if lo is not None else 1
    raw = [base * 2, base + 1, base - 1, base // 2 if kind is int else base / 2, 1, 2, 4, 8, 0.5, lo, hi]
    if base == 0:
        raw = [1, 2, 0.5, *raw]
    out = []
    for v in raw:
        if v is None:
            continue
        v = kind(v)
        if kind is int and not float(v).is_integer():
            continue
        if lo is not None and (v < lo or (lo_strict and v == lo)):
            continue
        if hi is not None and (v > hi or (hi_strict and v == hi)):
            continue
        out.append(v)
    return out


def environment_args(recipe: Recipe) -> dict:
    """An argument the recipe's environment takes, with another value of its kind."""
    o = recipe.orchestrator
    name = o.environment if o is not None else default_of(field_at("orchestrator.environment"))
    if name not in envs.BUILTIN:
        return {"knob_test": 1}
    for p in inspect.signature(envs.BUILTIN[name]).parameters.values():
        now = (o.environment_args if o is not None else {}).get(p.name, p.default)
        if isinstance(now, bool):
            return {p.name: not now}
        if isinstance(now, int):
            return {p.name: now + 1}
        if isinstance(now, str):
            return {p.name: now + now[:1]}
    raise AssertionError(f"environment {name!r} takes no argument the walk can vary")


def value_at(recipe: Recipe, path: str):
    """The recipe's value at ``path``; None where a section on the way is absent."""
    node = recipe
    for part in path.split("."):
        if node is None:
            return None
        node = getattr(node, part, None)  # None too for a key of another engine's section
    return node


def absent_section(recipe: Recipe, path: str) -> str | None:
    """The first optional section on ``path`` the recipe does not have."""
    parts = path.split(".")
    node = recipe
    for i, part in enumerate(parts[:-1]):
        node = getattr(node, part, None)  # None too where the section is another engine's (inference.dynamo)
        if node is None:
            return ".".join(parts[: i + 1])
    return None


# ---- rendering ---------------------------------------------------------------------------------


def override(path: str, value) -> str:
    """``--set PATH=VALUE`` with VALUE as TOML."""
    return f"{path}={tomlw._value(value)}"


def environments(settings: dict) -> dict | None:
    """The environments the orchestrator with ``settings`` runs, loaded as it loads them at start (recipe
    field -> environment); None where one cannot be loaded here (a custom class of the user's)."""
    named = {"orchestrator.environment": (settings["environment"], settings.get("environment_args") or {})}
    e = settings.get("eval") or {}
    if e and not e.get("heldout", True):
        named["eval.environment"] = (e["environment"], e.get("environment_args") or {})
    try:
        return {field: envs.load(name, args, field) for field, (name, args) in named.items()}
    except SystemExit:
        return None


def runtime_unread(settings: dict) -> set[str]:
    """Keys of components/orchestrator.toml the orchestrator does not read for the environments it runs."""
    loaded = environments(settings)
    if loaded is None or any(env.chat for env in loaded.values()):
        return set()
    return {f.removeprefix("orchestrator.") for f in CHAT_ONLY if f.startswith("orchestrator.")}


def start_refusal(p) -> str | None:
    """The field the orchestrator refuses at start with the planned settings (before any rollout), or None."""
    for c in p.model_dump(mode="json")["components"]:
        if c["name"] == "orchestrator" and c.get("settings"):
            settings = c["settings"]
            loaded = environments(settings)
            try:
                refuse_chat_only(loaded or {}, settings["chat_only_set"] if loaded else [])
            except SystemExit as e:
                return str(e.code).removeprefix("slurmrl: ").split(":")[0]
    return None


def plan_view(p) -> dict:
    """plan.json and components/*.toml (the plan), less what the programs do not read."""
    data = p.model_dump(mode="json")
    for c in data["components"]:
        settings = c.get("settings") or {}
        unread = set(UNREAD.get((c["name"], p.kind), ()))
        if c["name"] == "orchestrator" and settings:  # chat_only_set acts only through the start (start_refusal)
            unread |= runtime_unread(settings) | {"chat_only_set"}
        for key in unread:
            settings.pop(key, None)
    return data


@cache
def baseline(recipe: Path):
    r, p, run_dir = planned(recipe, [], run_dir=RUN_DIR)
    return r, p, plan_view(p), read_toml(recipe)


@cache
def baseline_script(recipe: Path) -> str:
    return render_script(baseline(recipe)[1], RUN_DIR, recipe.name)


def names(err: UserError, path: str) -> bool:
    f = err.field or ""
    return f == path or path.startswith(f + ".") or f.startswith(path + ".") or f in REFUSED_AS.get(path, ())


def outcome(recipe: Path, path: str, value) -> tuple[str, str]:
    """("changed" | "refused" | "same" | "invalid" | "other", detail)."""
    r0, p0, view0, raw = baseline(recipe)
    text = override(path, value)
    data = apply_overrides(copy.deepcopy(raw), [text])
    for _ in range(4):
        try:  # what load_recipe and planned do for `--set TEXT`, with the run dir fixed
            check_numbers(data)
            p = plan(Recipe.model_validate(data), RUN_DIR)
            break
        except ValidationError as e:  # the schema refuses the value itself: not a shape's answer,
            shown = format_validation_error(e)  # unless it is a key of another engine's section
            if e.errors()[0]["type"] == "extra_forbidden" and "not a key of" in shown.message and names(shown, path):
                return "refused", str(shown)
            return "invalid", str(e.errors()[0]["msg"])
        except UserError as e:
            if names(e, path):
                return "refused", str(e)
            if not drop_default(data, e.field or ""):
                return "other", str(e)
    refused = start_refusal(p)
    if refused is not None:
        return ("refused", f"at the orchestrator's start: {refused}") if names(UserError(refused, ""), path) \
            else ("other", f"the orchestrator refuses {refused} at start")
    if plan_view(p) != view0:
        return "changed", ""
    if render_script(p, RUN_DIR, recipe.name) != baseline_script(recipe):
        return "changed", ""
    return "same", text


def drop_default(data: dict, path: str) -> bool:
    """Remove ``path`` from the recipe's data where the recipe sets it to its default: a field the new
    value leaves with nothing to do (explicit defaults are refused like any value; issue 27), which a
    user changing the value would remove as well. False where it is not such a field."""
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or last not in node:
        return False
    try:
        f = field_at(path)
    except (KeyError, AttributeError):
        return False
    if f.is_required() or node[last] != default_of(f):
        return False
    del node[last]
    return True


def check_field(recipe: Path, path: str) -> tuple[str, str]:
    """("acts" | "silent" | "bound" | "untested", what was tried) for ``path`` in this recipe's shape.
    "untested": no value could be tried (each invalid, or refused for another field's sake);
    "bound": a capacity (CAPACITIES) that changed nothing here."""
    r0, *_ = baseline(recipe)
    f = field_at(path)
    current = value_at(r0, path)
    auto = current is None and default_of(f) is None  # None means "decided for you": one value may match it
    tried, decisive = [], []
    for value in candidates(path, f, current, r0)[:TRIES]:
        what, detail = outcome(recipe, path, value)
        tried.append(f"{value!r}: {what}{' (' + detail + ')' if detail and what != 'same' else ''}")
        if what in ("changed", "refused", "same"):
            decisive.append(what)
            if what != "same" or not auto:
                break
    detail = "; ".join(tried) or "no value to try"
    if not decisive:
        return "untested", detail
    if decisive[-1] == "same" and path not in CAPACITIES:
        return "silent", detail
    if decisive[-1] == "refused" and NOT_HERE.search(detail):  # the shape never reads it: its default neither
        silent = explicit_default(recipe, path, f)
        if silent:
            return "silent", f"{detail}; {silent}"
    return ("acts" if "same" not in decisive or auto else "bound"), detail


NOT_HERE = re.compile(r"only applies|: kind '[a-z]+' only")  # a refusal saying the shape never reads the field


def explicit_default(recipe: Path, path: str, f) -> str | None:
    """Where the shape refuses a field it never reads: the field set explicitly to its default must be
    refused too (issue 43: ``trainer.weight_sync = "filesystem"`` on an SFT job). What was tried when it
    is not; None when it is, or when the default cannot be written (None: "decided for you")."""
    default = default_of(f)
    if default is None or f.is_required():
        return None
    what, detail = outcome(recipe, path, default)
    return None if what == "refused" else f"its default {default!r} set explicitly: {what} {detail}".rstrip()


def walk(recipes=RECIPES, paths=None) -> list[str]:
    """Every silent knob, with its recipe; and every field that acts in no recipe at all."""
    problems: list[str] = []
    acted: dict[str, list[str]] = {}  # path -> recipes where it took effect or was refused
    untested: dict[str, list[str]] = {}  # path -> what was tried where no value could be tried
    for recipe in recipes:
        r0, *_ = baseline(recipe)
        for path, f in leaves():
            if (paths is not None and path not in paths) or path in OUTSIDE_RUN_DIR:
                continue
            absent = absent_section(r0, path)
            if absent is not None:
                model = section_model(field_at(absent).annotation)
                if any(x.is_required() for x in model.model_fields.values()):
                    continue  # e.g. [container] needs an image first: walked in recipes that have one
            what, detail = check_field(recipe, path)
            untested.setdefault(path, [])
            if what == "silent":
                problems.append(f"{recipe.name}: {path}: neither changes the run dir nor is refused: {detail}")
                acted.setdefault(path, [])  # reported already
            elif what == "acts":
                acted.setdefault(path, []).append(recipe.name)
            elif what == "untested":
                untested[path].append(f"{recipe.name}: {detail}")
    for path, why in untested.items():  # every field walked must act somewhere
        if path not in acted:
            problems.append(f"{path}: takes effect in no gallery recipe; no value tried was accepted, or each was "
                            f"refused for another field: {' | '.join(why) or 'it only bounded other fields'}")
    return problems
