"""slurmrl command line. Light imports only: plan/render/submit/status never load torch or vllm,
and each command imports what it uses when it runs (`plan` renders nothing: no jinja2)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from slurmrl import pydantic_plugins
from slurmrl.errors import UserError

STARTERS = Path(__file__).resolve().parent / "recipes"

EPILOG = """\
examples:
  slurmrl init rl-multinode > my.toml        write a commented starter recipe
  slurmrl plan my.toml                       show what would run where
  slurmrl plan my.toml --set inference.tp=4  the same with an override
  slurmrl render my.toml                     write the run dir (job.sbatch, plan.json, components/)
  sbatch runs/rl-multinode/job.sbatch        or: slurmrl submit my.toml
                                             (the run dir is OUTPUT_DIR/NAME: the recipe's name)

Bad input exits with code 2 and one line naming the field."""


def _job_id(text: str) -> int:
    """A Slurm job id: a positive 32-bit number."""
    if not text.isdigit() or not 1 <= int(text) < 2**32:
        raise argparse.ArgumentTypeError(f"{text!r} is not a Slurm job id (1 to {2**32 - 1})")
    return int(text)


def _starters() -> list[str]:
    return sorted(p.stem for p in STARTERS.glob("*.toml"))


def _recipe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe TOML file")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a recipe field, e.g. --set trainer.nodes=4 (VALUE is read as TOML; repeatable)",
    )


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line. ``only``: the command being run; the others' subparsers are left out
    (building all twelve costs a `slurmrl plan` more than its planning), help is unchanged."""

    def wanted(name: str) -> bool:
        return only is None or only == name

    ap = argparse.ArgumentParser(
        prog="slurmrl", description="One TOML recipe becomes a readable, hand-editable sbatch script.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    if wanted("init"):
        p = sub.add_parser("init", help="print or write a commented starter recipe")
        p.add_argument("shape", nargs="?", default="rl-debug", help=f"one of: {', '.join(_starters())}")
        p.add_argument("-o", "--output", help="write to this file instead of stdout (refuses to overwrite)")

    if wanted("validate"):
        text = ("check a recipe and its topology; print nothing if it is good (errors and warnings go to stderr; "
                "exit 2 on an error)")
        p = sub.add_parser("validate", help=text, description=text)
        _recipe_args(p)

    if wanted("plan"):
        p = sub.add_parser("plan", help="show het groups, GPU map, components, ports; write nothing")
        _recipe_args(p)
        p.add_argument("--json", action="store_true", help="print plan.json instead of the summary")
        p.add_argument("--salloc", action="store_true",
                       help="print the salloc line for this allocation, running RUN_DIR/job.sbatch inside it")
        p.add_argument("--job-id", type=_job_id, help="show the ports this job id would get")
        p.add_argument("--run-dir", help="run dir to plan for (default: OUTPUT_DIR/NAME)")

    if wanted("render"):
        p = sub.add_parser("render", help="write the run dir and print its path")
        _recipe_args(p)
        p.add_argument("--force", action="store_true", help="render over a run dir that was already submitted")
        p.add_argument("--run-dir", help="write here instead of OUTPUT_DIR/NAME")
        p.add_argument("--stdout", action="store_true", help="print job.sbatch instead of writing the run dir")
        p.add_argument(
            "--preflight", action="store_true",
            help="render the preflight variant (every component runs slurmrl.runtime.steps.probe) into NAME-preflight",
        )

    if wanted("templates"):
        p = sub.add_parser("templates", help="work with the sbatch templates")
        tsub = p.add_subparsers(dest="templates_command", required=True, metavar="ACTION")
        e = tsub.add_parser("eject", help="copy the templates to DIR; point a recipe's templates_dir at it")
        e.add_argument("dir")

    if wanted("plot"):
        p = sub.add_parser("plot", help="reward curve of an RL run (terminal chart, RUN_DIR/reward.png), or the "
                           "results of its [benchmark] (table, RUN_DIR/benchmark/benchmark.png)")
        p.add_argument("run_dir", metavar="RUN_DIR|SWEEP_DIR", help="a sweep dir: every point's reward curve on "
                       "one chart (SWEEP_DIR/reward.png)")

    if only is None:
        from slurmrl.slurm import commands as slurm_commands  # submit/status/logs/cancel/diff

        slurm_commands.add_parsers(sub, _recipe_args)
    return ap


def cmd_init(args) -> int:
    if args.shape not in _starters():
        raise UserError("shape", f"unknown shape {args.shape!r}; choose one of: {', '.join(_starters())}")
    text = (STARTERS / f"{args.shape}.toml").read_text()
    if not args.output:
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if out.exists():
        raise UserError(str(out), "exists; choose another file name")
    out.write_text(text)
    print(out)
    return 0


def cmd_validate(args) -> int:
    from slurmrl.render import build

    for warning in build(args.recipe, args.overrides).plan.warnings:
        print(f"slurmrl: warning: {warning}", file=sys.stderr)
    return 0  # a good recipe prints nothing: `slurmrl validate x.toml && ...`


def cmd_plan(args) -> int:
    from slurmrl.render import plan_json, planned

    _, p, run_dir = planned(args.recipe, args.overrides, args.run_dir)
    if args.json:
        print(plan_json(p), end="")
        return 0
    from slurmrl.summary import salloc_line, summary

    if not args.salloc:
        print(summary(p, run_dir, args.job_id))
        return 0
    script = Path(run_dir) / "job.sbatch"
    print(salloc_line(p, script))
    if not script.exists():
        print(f"slurmrl: {script} is not rendered yet: run `slurmrl render` with the same recipe and options first",
              file=sys.stderr)
    return 0


def cmd_render(args) -> int:
    from slurmrl.render import build, render

    if args.stdout:
        print(build(args.recipe, args.overrides, args.run_dir, args.preflight).script, end="")
        return 0
    out = render(args.recipe, args.overrides, force=args.force, run_dir=args.run_dir, preflight=args.preflight)
    print(out.run_dir)
    return 0


def cmd_templates(args) -> int:
    import shutil

    from slurmrl.render.script import PACKAGE_TEMPLATES

    dest = Path(args.dir)
    if dest.exists() and any(dest.iterdir()):
        raise UserError(str(dest), "exists and is not empty; eject into a new folder")
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(PACKAGE_TEMPLATES.glob("*.j2")):
        shutil.copy2(f, dest / f.name)
    print(f"{dest}: set templates_dir = {str(dest.resolve())!r} in your recipe to render with these")
    return 0


def cmd_plot(args) -> int:
    from slurmrl.plot import plot
    from slurmrl.sweep import is_sweep_dir

    if is_sweep_dir(args.run_dir):  # every point's reward curve on one chart
        from slurmrl.slurm.sweep_status import sweep_plot

        return sweep_plot(args.run_dir)

    return plot(args.run_dir)


def main(argv: list[str] | None = None) -> int:
    pydantic_plugins.skip_lookup()
    try:
        argv = sys.argv[1:] if argv is None else argv
        args = _parser(argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv)
        handler = COMMANDS.get(args.command)
        if handler is None:
            from slurmrl.slurm import commands as slurm_commands

            handler = slurm_commands.HANDLERS[args.command]
        return handler(args)
    except UserError as e:
        print(f"slurmrl: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `slurmrl plan x.toml | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


COMMANDS = {"init": cmd_init, "validate": cmd_validate, "plan": cmd_plan, "render": cmd_render,
            "templates": cmd_templates, "plot": cmd_plot}

if __name__ == "__main__":
    sys.exit(main())
