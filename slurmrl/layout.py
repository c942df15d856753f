"""The run dir's layout: every path under a run dir is named here, and only here.

A leaf module (standard library only): the planner, the renderer, the runtimes inside job
steps and the login-node commands (submit, status, logs, preflight) all go through it.

    RUN_DIR/
      job.sbatch                     the script (the truth)
      plan.json  recipe.toml         what was planned, from what
      lock.toml                      the recipe as resolved plus provenance (slurmrl.lock); renders job.sbatch again
      links.json                     `submit --again` and sweep links: again_of, again_as, sweep
      components/<name>.toml         typed settings of our own programs (trainer, orchestrator)
      jobs.json                      every job submitted from this run dir
      allocations                    job ids of `bash job.sbatch` runs inside salloc
      secret                         the job's secret (mode 0600; see slurmrl.secret)
      logs/batch-<jobid>.out         the batch shell's log
      logs/attempt-N/<comp>.<task>.log
      logs/attempt-N/FAILED          why the job failed (one line)
      logs/attempt-N/phases          start-up milestones: "<unix time> <what>" per line
      logs/attempt-N/<comp>.waiting  why a front is not serving yet (slurmrl.runtime.steps.ready_check)
      logs/attempt-N/PREEMPTED       the warning signal came (and what the script did about it)
      logs/attempt-N/STOPPED         Slurm ended the attempt with SIGTERM (cancel, time limit)
      logs/job-<jobid>/              an earlier job's logs, set aside by submit
      ready/attempt-N/<comp>.<task>  a task passed its readiness check (its URL, its step's task count)
      heartbeat/attempt-N/<comp>.<task>  touched by a program's main loop; watched by its supervisor
      preflight/<comp>.<task>.json   probe reports
      dynamo/etcd-attempt-N/ dynamo/nats-attempt-N/  data of the etcd and NATS a Dynamo job starts
      benchmark/summary.json         the [benchmark] grid: status and one line of numbers per point
      benchmark/c<C>-in<I>-out<O>.json  vllm bench serve's result for one point; benchmark.png the plot
      rollouts/ weights/ checkpoints/ metrics*.jsonl   RL and SFT outputs
      merged/                        a LoRA policy's final model: base + adapter, a plain HF folder
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SCRIPT = "job.sbatch"
PLAN = "plan.json"
RECIPE = "recipe.toml"
LOCK = "lock.toml"  # a complete recipe plus provenance (slurmrl.lock); the job appends its versions
LINKS = "links.json"  # {"again_of": RUN_DIR, "again_as": [RUN_DIR, ...], "sweep": SWEEP_DIR}
SWEEP_INDEX = "sweep.json"  # a sweep dir's index: grid, points (params, run dir), submissions (slurmrl.sweep)
SWEEP_SCRIPT = "sweep.sbatch"  # a sweep's job array script: runs point SLURM_ARRAY_TASK_ID's job.sbatch
JOBS = "jobs.json"
ALLOCATIONS = "allocations"  # job ids of runs of job.sbatch inside salloc (the script appends them)
SECRET = "secret"  # the job's secret (slurmrl.secret), made by the job script
COMPONENTS = "components"
LOGS = "logs"
READY = "ready"
PREFLIGHT = "preflight"
BENCHMARK = "benchmark"  # the [benchmark] results (slurmrl.runtime.bench)
FAILED = "FAILED"
PREEMPTED = "PREEMPTED"
STOPPED = "STOPPED"  # Slurm ended the attempt (SIGTERM to the batch shell): cancel, time limit, preemption
JOB_OUTPUTS = (READY, PREFLIGHT, BENCHMARK)  # written by a job; stale once another job runs in the run dir


def merged_dir(run_dir: Path) -> Path:
    """A LoRA policy's final model, the adapter merged into the base (written after the last step)."""
    return Path(run_dir) / "merged"


def component_config(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / COMPONENTS / f"{name}.toml"


def attempt_dir(run_dir: Path, kind: str, attempt: int | str) -> Path:
    """``logs/attempt-N`` or ``ready/attempt-N``."""
    return Path(run_dir) / kind / f"attempt-{attempt}"


def log_dir(run_dir: Path, attempt: int | str) -> Path:
    return attempt_dir(run_dir, LOGS, attempt)


def ready_dir(run_dir: Path, attempt: int | str) -> Path:
    return attempt_dir(run_dir, READY, attempt)


def ready_file(run_dir: Path, attempt: int | str, component: str, task: int) -> Path:
    return ready_dir(run_dir, attempt) / f"{component}.{task}"


def phases_file(run_dir: Path, attempt: int | str) -> Path:
    """Start-up milestones of one attempt: ``<unix time> <what>`` per line (batch shell and programs)."""
    return log_dir(run_dir, attempt) / "phases"


def add_phase(run_dir: Path, attempt: int | str, what: str) -> None:
    path = phases_file(run_dir, attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:  # one short append: atomic next to the batch shell's
        f.write(f"{int(time.time())} {what}\n")


def read_phases(run_dir: Path, attempt: int | str) -> list[tuple[int, str]]:
    try:
        lines = phases_file(run_dir, attempt).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        ts, _, what = line.partition(" ")
        if ts.isdigit():
            out.append((int(ts), what))
    return out


def waiting_file(run_dir: Path, attempt: int | str, component: str) -> Path:
    """Why ``component`` is not serving yet, one line (removed once it serves); FAILED quotes it."""
    return log_dir(run_dir, attempt) / f"{component}.waiting"


def heartbeat_file(run_dir: Path, attempt: int | str, component: str, task: int) -> Path:
    """Touched by a program's main loop (slurmrl.heartbeat); its supervisor watches the age."""
    return attempt_dir(run_dir, "heartbeat", attempt) / f"{component}.{task}"


def failed_file(run_dir: Path, attempt: int | str) -> Path:
    return log_dir(run_dir, attempt) / FAILED


def batch_log(run_dir: Path, job_id: str) -> Path:
    return Path(run_dir) / LOGS / f"batch-{job_id}.out"


def set_aside_dir(run_dir: Path, job_id: str) -> Path:
    return Path(run_dir) / LOGS / f"job-{job_id}"


def preflight_dir(run_dir: Path) -> Path:
    return Path(run_dir) / PREFLIGHT


# The benchmark's folder, RUN_DIR/benchmark (the job passes it to slurmrl.runtime.bench as --out).
BENCHMARK_SUMMARY = "summary.json"  # status and one line of numbers per grid point (`slurmrl status`)
BENCHMARK_PLOT = "benchmark.png"


def benchmark_point_name(concurrency: int, input_len: int, output_len: int) -> str:
    """vllm bench serve's result for one grid point (per-request lists left out)."""
    return f"c{concurrency}-in{input_len}-out{output_len}.json"


def benchmark_dir(run_dir: Path) -> Path:
    return Path(run_dir) / BENCHMARK


def benchmark_summary(run_dir: Path) -> Path:
    return benchmark_dir(run_dir) / BENCHMARK_SUMMARY


def benchmark_plot(run_dir: Path) -> Path:
    return benchmark_dir(run_dir) / BENCHMARK_PLOT


DYNAMO = "dynamo"  # data of the etcd and NATS servers a Dynamo job starts, one folder per attempt


def dynamo_data_dir(run_dir: Path | str, attempt: int | str, service: str) -> Path:
    """``dynamo/<service>-attempt-N``: etcd's ``--data-dir`` or NATS's JetStream store (``-sd``)."""
    return Path(run_dir) / DYNAMO / f"{service}-attempt-{attempt}"


def attempts(run_dir: Path) -> list[int]:
    """Attempt numbers that have a log or ready folder, in order."""
    found = set()
    for kind in (LOGS, READY):
        for d in (Path(run_dir) / kind).glob("attempt-*"):
            suffix = d.name.removeprefix("attempt-")
            if suffix.isdigit():
                found.add(int(suffix))
    return sorted(found)


# ---- inside a job step -------------------------------------------------------------------
def run_dir_from_env(env=None) -> Path:
    """The run dir of the job this step belongs to (the script exports SLURMRL_RUN_DIR)."""
    env = os.environ if env is None else env
    value = env.get("SLURMRL_RUN_DIR")
    if not value:
        raise SystemExit("slurmrl: SLURMRL_RUN_DIR is not set; run this inside the job script")
    return Path(value)


def attempt_from_env(env=None) -> str:
    env = os.environ if env is None else env
    return env.get("SLURMRL_ATTEMPT", "0")


# ---- ready files ---------------------------------------------------------------------------
# One per task, written once the task's own readiness check passed. Plain lines, so the batch
# shell reads them with `read`: the URL others reach the task at ("-" when it serves nothing),
# the number of tasks in its step (so the script knows how many to wait for, even after a hand
# edit of --ntasks-per-node), and the pid of the command the task runs ("-" when unknown).
def write_ready(path: Path, url: str | None, ntasks: int, pid: int | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{url or '-'}\n{ntasks}\n{pid or '-'}\n")
    tmp.replace(path)


def read_ready(path: Path) -> tuple[str | None, int, int | None]:
    """(url or None, the step's task count, the command's pid or None) from a ready file."""
    url, count, pid = (Path(path).read_text().splitlines() + ["-", "0", "-"])[:3]
    url, count, pid = url.strip(), count.strip(), pid.strip()
    return (None if url in ("", "-") else url), (int(count) if count.isdigit() else 0), (int(pid) if pid.isdigit() else None)


def ready_tasks(run_dir: Path, attempt: int | str, component: str) -> dict[int, Path]:
    """task -> ready file, for every task of ``component`` that is ready in ``attempt``."""
    out = {}
    for f in ready_dir(run_dir, attempt).glob(f"{component}.*"):
        task = f.name.rsplit(".", 1)[-1]
        if task.isdigit():
            out[int(task)] = f
    return dict(sorted(out.items()))
