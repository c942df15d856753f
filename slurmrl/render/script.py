"""plan -> job.sbatch text, through the jinja2 templates. Deterministic; decides nothing."""

from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from slurmrl import ports
from slurmrl.errors import UserError
from slurmrl.plan.model import Plan
from slurmrl.render.quoting import sbatch_value, shjoin, shlines, shq
from slurmrl.rundir.text import is_one_line

PACKAGE_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
ENTRY = "job.sbatch.j2"


def environment(templates_dir: Path | None = None) -> jinja2.Environment:
    """The package's templates compile once per process; an ejected copy is read afresh (it may be edited)."""
    return _environment(templates_dir) if templates_dir is not None else _package_environment()


@functools.cache
def _package_environment() -> jinja2.Environment:
    return _environment(None)


def _environment(templates_dir: Path | None) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir or PACKAGE_TEMPLATES)),
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


def render_script(plan: Plan, run_dir: str, recipe_file: str, templates_dir: Path | None = None) -> str:
    # both reach comment and #SBATCH lines as they are: a line break there would start a line of shell
    for field, value in (("recipe file", recipe_file), ("run dir", run_dir)):
        if not is_one_line(value):
            raise UserError(field, f"{value[:60]!r} holds a line break; it is written into job.sbatch's comments")
    template = environment(templates_dir).get_template(ENTRY)
    return template.render(
        plan=plan,
        run_dir=run_dir,
        recipe_file=recipe_file,
        port_base_expr=ports.base_expr(),
        port_base_min=ports.BASE_MIN,
        port_stride=ports.STRIDE,
        port_slots=ports.SLOTS,
        main_components=[c.name for c in plan.components if c.main],
    )
