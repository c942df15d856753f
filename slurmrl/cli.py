"""slurmrl command line: every verb's argparse parser, and the dispatch to ``slurmrl.app.<module>``'s
``cmd_<verb>``, imported when the verb runs (one module per verb: `plan` loads no jinja2, no Slurm
code, no lock file and no sweep grid; nothing on the CLI path loads torch or vllm). A new verb: app/<verb>.py, its parser here, a
line in VERBS."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from pathlib import Path

from slurmrl import pydantic_plugins
from slurmrl.errors import UserError

REMOTE_COMMANDS = ("submit", "status", "logs", "cancel", "attach")  # they take --cluster NAME

PREFLIGHT_TIMEOUT_S = 900
CANCEL_TIMEOUT_S = 120
MAX_TIMEOUT_S = 7 * 86400


def _seconds(text: str) -> float:
    """--timeout: a finite number of seconds from 1 to a week (a UserError: one line, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise UserError("--timeout", f"needs a number of seconds, not {text!r}") from None
    if not 1 <= value <= MAX_TIMEOUT_S:  # also refuses nan and inf
        raise UserError("--timeout", f"{text!r} is out of range (1 to {MAX_TIMEOUT_S} seconds)")
    return value


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
        p.add_argument("--force", action="store_true", help="render over a run dir that was submitted or edited by hand")
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

    if wanted("report"):
        p = sub.add_parser("report", help="one HTML page of what the job left (RUN_DIR/report/index.html, PNGs "
                           "beside it): throughput, latency, queues, KV cache, GPUs, the RL step's time split, curves, "
                           "weight sync, the benchmark, the phases of every attempt")
        p.add_argument("run_dir", metavar="RUN_DIR|SWEEP_DIR", help="a sweep dir: every point's report, and "
                       "SWEEP_DIR/report/index.html with the points side by side")

    if only is None:
        _slurm_parsers(sub, _recipe_args)
    return ap


def _slurm_parsers(sub, recipe_args) -> None:
    """The subcommands that talk to Slurm: submit, sweep, diff, status, logs, attach, cancel."""
    p = sub.add_parser(
        "submit", help="render (for a recipe), check the cluster can hold it, sbatch, record in jobs.json",
        description="Submit RECIPE (rendered first), or RUN_DIR / RUN_DIR/job.sbatch as it is (hand edits kept).",
    )
    recipe_args(p)
    p.add_argument("--force", action="store_true", help="render over a run dir that was already submitted")
    p.add_argument("--preflight", action="store_true",
                   help="run the probe in every component's layout, wait for it, check the reports against the plan")
    p.add_argument("--timeout", type=_seconds, default=PREFLIGHT_TIMEOUT_S, metavar="SECONDS",
                   help=f"with --preflight: how long to wait for the job (default {PREFLIGHT_TIMEOUT_S})")
    p.add_argument("--again", action="store_true",
                   help="TARGET is a run dir: submit the same run (hand edits kept) as a new run dir RUN_DIR-again-N, "
                        "rendered from its lock; the two are linked both ways (links.json, shown by status)")
    p.add_argument("--join", metavar="RUN_DIR",
                   help="TARGET is a recipe: submit its [inference] servers alone, as a second job (on its own "
                        "slurm.partition, e.g. a preemptible one with slurm.requeue = false) whose servers join the "
                        "running RL job of RUN_DIR: same model, RUN_DIR's secret; each is admitted with the current "
                        "weights at the next step and leaves when its job ends (`slurmrl status RUN_DIR` lists them)")
    for action in p._actions:  # the positional is a recipe, a run dir or a job script
        if action.dest == "recipe":
            action.metavar, action.help = "TARGET", "recipe TOML, run dir, or RUN_DIR/job.sbatch"

    text = ("render one run dir per point of a grid of recipe values (under OUTPUT_DIR/NAME-sweep/, with an index) "
            "and submit them: one job array where Slurm allows it, else one job per point")
    p = sub.add_parser("sweep", help=text, description=text + ". Give a sweep dir instead of a recipe to submit "
                       "it (after --render-only and hand edits). `slurmrl status|cancel|plot SWEEP_DIR` follow it.")
    p.add_argument("recipe", metavar="RECIPE|SWEEP_DIR", help="recipe TOML (its [sweep] table holds a grid too), or a "
                   "rendered sweep dir to submit")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="a recipe field and its values, e.g. --grid trainer.lr=1e-6,3e-6 (each VALUE read as --set "
                        "reads it; repeatable: every combination is a point)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe field for every point")
    p.add_argument("--max-running", metavar="N", help="run at most N points at once")  # checked by app.sweep
    p.add_argument("--sweep-dir", help="write the sweep here instead of OUTPUT_DIR/NAME-sweep")
    p.add_argument("--render-only", action="store_true", help="write the sweep dir, submit nothing")

    p = sub.add_parser("diff", help="show hand edits: every file the job reads against a fresh render of its recipe.toml")
    p.add_argument("run_dir")

    p = sub.add_parser("status", help="job state per het group, step and readiness per component")
    p.add_argument("target", nargs="?", metavar="RUN_DIR|JOBID|SWEEP_DIR", help="default: the run dir you are in "
                   "(a sweep dir: one row per point)")
    p.add_argument("--watch", action="store_true", help="refresh until the job ends (exit 0 if it completed)")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("logs", help="print the component logs of the latest attempt; -f follows")
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--component", help="only this component (or 'batch' for the batch shell's log)")
    p.add_argument("--attempt", type=int, help="attempt number (default: the latest)")
    p.add_argument("-f", "--follow", action="store_true", help="follow new lines until the job ends")

    p = sub.add_parser(
        "attach", help="run a command (default: a shell) on a running component's node, in its container",
        usage="slurmrl attach [-h] RUN_DIR COMPONENT [--node N | --task T] [--cluster NAME] [-- CMD ...]",
        description="srun --overlap into the running job: on the node of COMPONENT (node 0 unless --node "
                    "or --task), inside the job's container when it has one. Without CMD: an interactive "
                    "shell (--pty).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("component", metavar="COMPONENT", help="a component of the job (trainer, inference, router, ...)")
    p.add_argument("--node", type=int, metavar="N", help="the component's N-th node (default 0)")
    p.add_argument("--task", type=int, metavar="T",
                   help="the node task T runs on (its ready file's URL, else the plan)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD",
                   help="what to run (default: an interactive shell)")

    p = sub.add_parser("cancel", help="scancel the job and wait until it has ended")
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--timeout", type=_seconds, default=CANCEL_TIMEOUT_S, metavar="SECONDS",
                   help=f"how long to wait for the job to end (default {CANCEL_TIMEOUT_S})")
    for name in REMOTE_COMMANDS:
        sub.choices[name].add_argument(
            "--cluster", metavar="NAME",
            help="run Slurm's commands on cluster NAME of the clusters file, over ssh (default: the cluster "
                 "the run dir's last job went to, else this machine)")


def main(argv: list[str] | None = None) -> int:
    pydantic_plugins.skip_lookup()
    argv = sys.argv[1:] if argv is None else argv
    collecting = gc.isenabled()
    if argv and argv[0] in QUICK_VERBS:
        gc.disable()  # see QUICK_VERBS
    try:
        args = _parser(argv[0] if argv and argv[0] in LOCAL_VERBS else None).parse_args(argv)
        verb = args.command.replace("-", "_")
        # the one import per verb, here for start-up time: `slurmrl plan` loads no jinja2, no Slurm code
        handler = getattr(importlib.import_module(f"slurmrl.app.{VERBS[args.command]}"), f"cmd_{verb}")
        return handler(args)
    except UserError as e:
        print(f"slurmrl: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `slurmrl plan x.toml | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        if collecting:  # a caller in this process (a test, a script) gets its collector back
            gc.enable()


# verb -> its module under slurmrl/app/ (which defines cmd_<verb>). A new verb: app/<verb>.py, its parser above.
VERBS = {"init": "build", "validate": "build", "plan": "plan", "render": "build", "templates": "build",
         "plot": "plot", "submit": "submit", "sweep": "sweep", "diff": "diff", "status": "status", "logs": "logs",
         "attach": "attach", "cancel": "cancel", "report": "report"}
# Verbs that run for a moment and end: Python's cyclic garbage collector stays off while they run. Their
# imports build ~50 pydantic model classes and their schemas, ~50,000 tracked objects that live to the end,
# which each collection would walk again (~5% of a `slurmrl plan`); what they leave is freed at exit.
QUICK_VERBS = ("init", "validate", "plan", "render", "templates")
LOCAL_VERBS = ("init", "validate", "plan", "render", "templates", "plot", "report")  # parsed without the Slurm verbs' parsers

if __name__ == "__main__":
    sys.exit(main())
