"""CLI commands that talk to Slurm: submit (and submit --again), sweep, diff, status, logs, cancel, attach."""

from __future__ import annotations

import argparse
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir.paths import RunDir

HANDLERS: dict = {}
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


def add_parsers(sub, recipe_args) -> None:
    """Register the Slurm-facing subcommands on the main parser."""
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
    p.add_argument("--max-running", type=int, metavar="N", help="run at most N points at once")
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


def cmd_submit(args: argparse.Namespace) -> int:
    from slurmrl.slurm.submit import announce, submit

    if args.again:
        from slurmrl.app.again import again

        if args.overrides:
            raise UserError("--set", "with --again, edit the run dir (or its lock.toml) instead")
        new = again(args.recipe)
        print(f"{new}: {args.recipe} again (rendered from its lock, hand edits carried over)")
        args.recipe = str(new)
    s = submit(args.recipe, args.overrides, args.force, args.preflight)
    announce(s)
    if not args.preflight:
        return 0
    from slurmrl.slurm.preflight import wait_and_check

    print(f"preflight: waiting up to {args.timeout:.0f}s for job {s.job_id} to end", flush=True)
    return wait_and_check(s.run_dir, s.job_id, args.timeout)


def cmd_diff(args: argparse.Namespace) -> int:
    from slurmrl.slurm.diff import diff

    return diff(args.run_dir)


def cmd_status(args: argparse.Namespace) -> int:
    from slurmrl.slurm.status import status
    from slurmrl.sweep import is_sweep_dir

    if is_sweep_dir(args.target):
        from slurmrl.slurm.sweep_status import sweep_status

        return sweep_status(args.target, watch=args.watch, as_json=args.json)

    return status(args.target, watch=args.watch, as_json=args.json)


def cmd_logs(args: argparse.Namespace) -> int:
    from slurmrl.slurm.logs import logs

    return logs(args.run_dir, args.component, args.attempt, args.follow)


def cmd_cancel(args: argparse.Namespace) -> int:
    from slurmrl.slurm.cancel import cancel
    from slurmrl.sweep import cancel_sweep, is_sweep_dir

    if is_sweep_dir(args.run_dir):
        return cancel_sweep(args.run_dir, args.timeout)

    return cancel(args.run_dir, args.timeout)


def cmd_sweep(args: argparse.Namespace) -> int:
    from slurmrl import sweep

    if args.max_running is not None and args.max_running < 1:
        raise UserError("--max-running", f"{args.max_running} is not a number of jobs (1 or more)")
    if sweep.is_sweep_dir(args.recipe):
        if args.grid or args.overrides:
            raise UserError("--grid", "applies to a recipe; this is a rendered sweep dir (edit its points, or sweep "
                                      "the recipe again)")
        sweep_dir = Path(args.recipe).resolve()
    else:
        sweep_dir = sweep.render_sweep(args.recipe, args.grid, args.overrides, args.max_running, args.sweep_dir)
        n = len(sweep.read_index(sweep_dir).points)
        print(f"{sweep_dir}: {n} point(s), one run dir each (index: {RunDir(sweep_dir).sweep_index})")
        if args.render_only:
            print(f"  slurmrl sweep {sweep_dir}    submits it")
            return 0
    sweep.announce(sweep_dir, sweep.submit_sweep(sweep_dir, args.max_running))
    return 0


def cmd_attach(args: argparse.Namespace) -> int:
    from slurmrl.slurm.attach import attach

    return attach(args.run_dir, args.component, args.node, args.task, args.cmd)


def on_cluster(handler):
    """Run ``handler`` with its Slurm commands on ``--cluster NAME`` (slurmrl.remote), or here."""
    def run(args: argparse.Namespace) -> int:
        from slurmrl.remote import transport_for
        from slurmrl.slurm import tools

        if handler is cmd_attach:  # argparse leaves options written after COMPONENT in the command
            from slurmrl.slurm.attach import split_command

            args.node, args.task, args.cmd, args.cluster = split_command(args.cmd, args.node, args.task, args.cluster)
        target = next((getattr(args, a) for a in ("recipe", "target", "run_dir") if hasattr(args, a)), None)
        with tools.using(transport_for(getattr(args, "cluster", None), target)):
            return handler(args)
    return run


HANDLERS.update(submit=cmd_submit, diff=cmd_diff, status=cmd_status, logs=cmd_logs, cancel=cmd_cancel,
                attach=cmd_attach, sweep=cmd_sweep)
# diff: a run dir of a cluster's job re-renders for its path there
HANDLERS.update({name: on_cluster(HANDLERS[name]) for name in (*REMOTE_COMMANDS, "diff")})
