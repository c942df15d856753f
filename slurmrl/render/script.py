"""plan -> job.sbatch text (and the helper file it sources), through the jinja2 templates.
Deterministic; decides nothing. A mistake in an ejected template is one line naming its file and line."""

from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from slurmrl import ports
from slurmrl.errors import UserError
from slurmrl.plan.model import Plan
from slurmrl.render.quoting import sbatch_value, shjoin, shlines, shq
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.text import is_one_line

PACKAGE_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
ENTRY = "job.sbatch.j2"
FUNCTIONS = RunDir.FUNCTIONS  # the helper file job.sbatch sources, in the run dir
FUNCTIONS_ENTRY = FUNCTIONS + ".j2"
FUNCTIONS_VERSION = 2  # job.sbatch names the version it was written for; bump on an incompatible change


class _Loader(jinja2.FileSystemLoader):
    """A template file that is not UTF-8 is a syntax error at the line of its first bad byte."""

    def get_source(self, environment, template):
        try:
            return super().get_source(environment, template)
        except UnicodeDecodeError as e:
            for folder in self.searchpath:
                path = Path(folder) / template
                if path.is_file():
                    line = path.read_bytes()[: e.start].count(b"\n") + 1
                    raise jinja2.TemplateSyntaxError("not UTF-8 text", line, template, str(path)) from None
            raise


def environment(templates_dir: Path | None = None) -> jinja2.Environment:
    """The package's templates compile once per process; an ejected copy is read afresh (it may be edited)."""
    return _environment(templates_dir) if templates_dir is not None else _package_environment()


@functools.cache
def _package_environment() -> jinja2.Environment:
    return _environment(None)


def _environment(templates_dir: Path | None) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=_Loader(str(templates_dir or PACKAGE_TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        comment_start_string="{##",  # bash uses {# (e.g. ${#array[@]})
        comment_end_string="##}",
    )
    env.filters.update(shq=shq, shjoin=shjoin, shlines=shlines, sbatch_value=sbatch_value, port_var=ports.shell_var)
    return env


def _where(e: BaseException, templates_dir: Path, entry: str) -> tuple[str, int | None]:
    """The template file and line a Jinja error comes from: the error's own for a syntax error,
    else the innermost template frame of its traceback (Jinja maps those to template lines)."""
    if isinstance(e, jinja2.TemplateSyntaxError) and (e.filename or e.name):
        return e.filename or str(templates_dir / (e.name or "")), e.lineno
    folder = str(templates_dir.resolve())
    where: tuple[str, int | None] = (str(templates_dir / entry), None)
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name.startswith(folder) and not name.endswith(".py"):
            where = (name, tb.tb_lineno)
        tb = tb.tb_next
    return where


def _message(e: BaseException) -> str:
    if isinstance(e, jinja2.TemplateNotFound):
        return f"includes {e.name!r}, which is not there"
    if isinstance(e, jinja2.TemplateSyntaxError):
        return e.message or "syntax error"
    if isinstance(e, jinja2.UndefinedError):  # StrictUndefined: "'x' is undefined", "... has no attribute 'y'"
        return e.message if e.message and "undefined" in e.message else f"undefined: {e.message}"
    if isinstance(e, RecursionError):
        return "includes itself (recursion)"
    return f"{e.__class__.__name__}: {e}"


def _render(templates_dir: Path | None, entry: str, **context) -> str:
    """Render ``entry``; with ejected templates, any error in them is a UserError naming file and line."""
    if templates_dir is None:  # the package's own templates: a failure here is a bug, shown as one
        return environment(None).get_template(entry).render(**context)
    try:
        return environment(templates_dir).get_template(entry).render(**context)
    except Exception as e:  # noqa: BLE001 - anything an edited template does wrong is the user's to fix
        path, line = _where(e, templates_dir, entry)
        raise UserError(f"{path}:{line}" if line else path, _message(e)) from None


def render_functions(templates_dir: Path | None = None) -> str:
    """RUN_DIR/slurmrl-functions.sh: the same text for every job (its golden is sbatch/slurmrl-functions.sh).
    Ejected templates without the helper's template render the package's helper."""
    if templates_dir is not None and not (templates_dir / FUNCTIONS_ENTRY).is_file():
        templates_dir = None
    return _render(templates_dir, FUNCTIONS_ENTRY, version=FUNCTIONS_VERSION, port_base_min=ports.BASE_MIN,
                   port_stride=ports.STRIDE, port_lowest=ports.LOWEST, port_top=ports.TOP)


def render_script(plan: Plan, run_dir: str, recipe_file: str, templates_dir: Path | None = None) -> str:
    # both reach comment and #SBATCH lines as they are: a line break there would start a line of shell
    for field, value in (("recipe file", recipe_file), ("run dir", run_dir)):
        if not is_one_line(value):
            raise UserError(field, f"{value[:60]!r} holds a line break; it is written into job.sbatch's comments")
    return _render(
        templates_dir,
        ENTRY,
        plan=plan,
        run_dir=run_dir,
        recipe_file=recipe_file,
        functions_version=FUNCTIONS_VERSION,
        port_base_expr=ports.base_expr(),
        main_components=[c.name for c in plan.components if c.main],
        noncritical=[c.name for c in plan.components if not c.critical],
    )
