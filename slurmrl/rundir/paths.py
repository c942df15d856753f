"""The run dir's layout: every path under a run dir is named here, and only here.

One object, :class:`RunDir` (submitit's ``JobPaths`` is the model), owns the paths; callers never
spell one. A leaf (standard library only): the planner, the renderer, the runtimes inside job
steps (``RunDir.from_env()``) and the login-node commands all go through it.

    RUN_DIR/
      job.sbatch                     the script (the truth)
      plan.json  recipe.toml         what was planned, from what
      lock.toml                      the recipe as resolved plus provenance (slurmrl.rundir.lockfile)
      links.json                     `submit --again` and sweep links: again_of, again_as, sweep
      sweep.json sweep.sbatch        a sweep dir's index and job array script (slurmrl.sweep)
      components/<name>.toml         typed settings of our own programs (trainer, orchestrator)
      jobs.json                      every job submitted from this run dir
      allocations                    job ids of `bash job.sbatch` runs inside salloc
      secret                         the job's secret (mode 0600; see slurmrl.secret)
      joined/<jobid>.<task>.json     a server of another job that joined this one (slurmrl.rundir.joined)
      logs/batch-<jobid>.out         the batch shell's log
      logs/attempt-N/<comp>.<task>.log
      logs/attempt-N/FAILED          why the job failed (one line)
      logs/attempt-N/phases          start-up milestones: "<unix time> <what>" per line
      logs/attempt-N/<comp>.waiting  why a front is not serving yet (slurmrl.runtime.steps.ready_check)
      logs/attempt-N/PREEMPTED       the warning signal came (and what the script did about it)
      logs/attempt-N/STOPPED         Slurm ended the attempt with SIGTERM (cancel, time limit)
      logs/attempt-N/END             why the attempt ended: "<unix time> <class> <requeued: yes|no> <why>"
      logs/attempt-N/NODE_FAULTS     nodes found bad as it ended or started: "<node> <reason>" per line
      logs/attempt-N/ended/<comp>.<task>  how and when a task's command ended (slurmrl.rundir.ended)
      logs/job-<jobid>/              an earlier job's logs, set aside by submit
      ready/attempt-N/<comp>.<task>  a task passed its readiness check (its URL, its step's task count)
      heartbeat/attempt-N/<comp>.<task>  touched by a program's main loop; watched by its supervisor
      preflight/<comp>.<task>.json   probe reports
      dynamo/etcd-attempt-N/ dynamo/nats-attempt-N/  data of the etcd and NATS a Dynamo job starts
      benchmark/summary.json         the [benchmark] grid: status and one line of numbers per point
      benchmark/c<C>-in<I>-out<O>.json  vllm bench serve's result for one point; benchmark.png the plot
      metrics/<role>.jsonl           one JSON line per step of the trainer and the orchestrator
      metrics/eval.jsonl             one JSON line per evaluation ([eval]; slurmrl.rundir.evals reads it)
      metrics/scrape/attempt-N/<target>.jsonl  the [collector]'s scrapes of one /metrics (slurmrl.rundir.scrape)
      metrics/endpoints/attempt-N/<comp>       the /metrics URL a program of ours serves (the collector reads it)
      report/index.html report/*.png  `slurmrl report`: one page and its charts
      rollouts/ weights/ checkpoints/   RL and SFT outputs
      merged/                        a LoRA policy's final model: base + adapter, a plain HF folder
"""

from __future__ import annotations

from pathlib import Path

from slurmrl.contract import job_env
from slurmrl.rundir import phases


class RunDir:
    """Every path of one run dir. ``RunDir(path)``; inside a job step ``RunDir.from_env()``."""

    # names relative to the run dir (for code that writes a run dir as a dict of files)
    SCRIPT = "job.sbatch"
    FUNCTIONS = "slurmrl-functions.sh"  # the helper file job.sbatch sources: the machinery every job shares
    PLAN = "plan.json"
    RECIPE = "recipe.toml"
    LOCK = "lock.toml"  # a complete recipe plus provenance (slurmrl.rundir.lockfile); the job appends its versions
    SLURMRL_CHECK = "slurmrl-check.py"  # [container]: the job's first step runs it there (slurmrl.contract.slurmrl_check)
    SLURMRL_CHECK_LOG = "slurmrl-check.log"  # its output, in logs/attempt-N
    LINKS = "links.json"  # {"again_of": RUN_DIR, "again_as": [RUN_DIR, ...], "sweep": SWEEP_DIR}
    SWEEP_INDEX = "sweep.json"  # a sweep dir's index: grid, points (params, run dir), submissions (slurmrl.sweep)
    SWEEP_SCRIPT = "sweep.sbatch"  # a sweep's job array script: runs point SLURM_ARRAY_TASK_ID's job.sbatch
    JOBS = "jobs.json"
    ALLOCATIONS = "allocations"  # job ids of runs of job.sbatch inside salloc (the script appends them)
    SECRET = "secret"  # the job's secret (slurmrl.secret), made by the job script
    JOINED = "joined"  # joined/<jobid>.<task>.json: a server of a joiner job, once it is ready (slurmrl.rundir.joined)
    COMPONENTS = "components"
    LOGS = "logs"
    READY = "ready"
    HEARTBEAT = "heartbeat"
    PREFLIGHT = "preflight"
    BENCHMARK = "benchmark"  # the [benchmark] results (slurmrl.runtime.bench)
    METRICS = "metrics"
    EVAL_METRICS = "eval.jsonl"  # one line per evaluation of the policy ([eval])
    SCRAPE = "scrape"  # metrics/scrape/attempt-N/<target>.jsonl: the [collector]'s scrapes
    ENDPOINTS = "endpoints"  # metrics/endpoints/attempt-N/<component>: a /metrics URL of ours
    REPORT = "report"  # `slurmrl report`: report/index.html and its PNGs
    REPORT_PAGE = "index.html"
    MERGED = "merged"
    ROLLOUTS = "rollouts"
    WEIGHTS = "weights"
    CHECKPOINTS = "checkpoints"
    WANDB = "wandb"
    DYNAMO = "dynamo"  # data of the etcd and NATS servers a Dynamo job starts, one folder per attempt
    LIVE_SET = "servers-live.json"  # the orchestrator's live set of servers (slurmrl.contract.live_set)
    SYNCED = "servers-synced.json"  # what the trainer's last broadcast reached (slurmrl.contract.live_set)
    EVENTS = "events.jsonl"  # deaths, restarts, joins, excluded nodes, why attempts ended (slurmrl.contract.events)
    FAILED = "FAILED"
    PHASES = "phases"
    PREEMPTED = "PREEMPTED"
    WORKER_RESTARTS = "worker-restarts"  # per server spanning nodes: its tasks' meeting files for a restart
    ENDED = "ended"  # per task: how and when its command ended (slurmrl.rundir.ended)
    END = "END"  # why the attempt ended, classified (slurmrl.contract.attempt_end), the job script's note
    NODE_FAULTS = "NODE_FAULTS"  # nodes Slurm or the node check found bad: "<node> <reason>" per line
    STOPPED = "STOPPED"  # Slurm ended the attempt (SIGTERM to the batch shell): cancel, time limit, preemption
    JOB_OUTPUTS = (READY, PREFLIGHT, BENCHMARK)  # written by a job; stale once another job runs in the run dir
    PULLED = (LOGS, READY, PREFLIGHT, BENCHMARK, METRICS)  # what a job writes and the login-node commands read
    BENCHMARK_SUMMARY = "summary.json"  # status and one line of numbers per grid point (`slurmrl status`)
    BENCHMARK_PLOT = "benchmark.png"
    REWARD_PLOT = "reward.png"

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    def __eq__(self, other) -> bool:
        return isinstance(other, RunDir) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    # ---- files of the run dir itself ------------------------------------------------------------
    @property
    def script(self) -> Path:
        return self.path / self.SCRIPT

    @property
    def plan(self) -> Path:
        return self.path / self.PLAN

    @property
    def recipe(self) -> Path:
        return self.path / self.RECIPE

    @property
    def lock(self) -> Path:
        return self.path / self.LOCK

    @property
    def links(self) -> Path:
        return self.path / self.LINKS

    @property
    def events(self) -> Path:
        """Every attempt's events, one JSON line each (slurmrl.contract.events)."""
        return self.path / self.EVENTS

    @property
    def live_set(self) -> Path:
        """The live set of servers the orchestrator writes, the trainer's broadcast reads."""
        return self.path / self.LIVE_SET

    @property
    def synced(self) -> Path:
        """The servers the trainer's last broadcast reached (and those it dropped)."""
        return self.path / self.SYNCED

    @property
    def jobs(self) -> Path:
        return self.path / self.JOBS

    @property
    def allocations(self) -> Path:
        return self.path / self.ALLOCATIONS

    @property
    def secret(self) -> Path:
        return self.path / self.SECRET

    @property
    def joined_dir(self) -> Path:
        return self.path / self.JOINED

    def joined_file(self, job_id: str, task: int) -> Path:
        """One server of joiner job ``job_id`` (its task ``task``), written once it is ready."""
        return self.joined_dir / f"{job_id}.{task}.json"

    @property
    def sweep_index(self) -> Path:
        return self.path / self.SWEEP_INDEX

    @property
    def sweep_script(self) -> Path:
        return self.path / self.SWEEP_SCRIPT

    @property
    def components_dir(self) -> Path:
        return self.path / self.COMPONENTS

    def component_config(self, name: str) -> Path:
        return self.components_dir / f"{name}.toml"

    @property
    def logs(self) -> Path:
        return self.path / self.LOGS

    @property
    def rollouts(self) -> Path:
        return self.path / self.ROLLOUTS

    @property
    def weights(self) -> Path:
        return self.path / self.WEIGHTS

    @property
    def checkpoints(self) -> Path:
        return self.path / self.CHECKPOINTS

    @property
    def wandb(self) -> Path:
        return self.path / self.WANDB

    @property
    def metrics_dir(self) -> Path:
        return self.path / self.METRICS

    def metrics(self, role: str) -> Path:
        """``metrics/<role>.jsonl``: one JSON line per step (slurmrl.runtime.metrics writes, rundir.metrics reads)."""
        return self.metrics_dir / f"{role}.jsonl"

    @property
    def eval_metrics(self) -> Path:
        """``metrics/eval.jsonl``: one JSON line per evaluation (the orchestrator writes, rundir.evals reads)."""
        return self.metrics_dir / self.EVAL_METRICS
    def scrape_dir(self, attempt: int | str) -> Path:
        return self.metrics_dir / self.SCRAPE / f"attempt-{attempt}"

    def scrape_file(self, attempt: int | str, target: str) -> Path:
        """One endpoint's scrapes (slurmrl.rundir.scrape): ``target`` is ``<component>.<task>`` or a name."""
        return self.scrape_dir(attempt) / f"{target}.jsonl"

    def scrape_files(self, attempt: int | str) -> list[Path]:
        return sorted(self.scrape_dir(attempt).glob("*.jsonl"))

    def scrape_attempts(self) -> list[int]:
        """Attempts with a scrape folder, in order."""
        found = [d.name.removeprefix("attempt-") for d in (self.metrics_dir / self.SCRAPE).glob("attempt-*")]
        return sorted(int(a) for a in found if a.isdigit())

    def metrics_endpoint(self, attempt: int | str, component: str) -> Path:
        """The /metrics URL a program of ours serves (one line); the collector scrapes it."""
        return self.metrics_dir / self.ENDPOINTS / f"attempt-{attempt}" / component

    def metrics_endpoints(self, attempt: int | str) -> list[Path]:
        return sorted(p for p in (self.metrics_dir / self.ENDPOINTS / f"attempt-{attempt}").glob("*")
                      if not p.name.startswith("."))

    def report_dir(self) -> Path:
        return self.path / self.REPORT

    def report_page(self) -> Path:
        """`slurmrl report`'s page; its PNGs lie beside it."""
        return self.report_dir() / self.REPORT_PAGE

    def merged_dir(self) -> Path:
        """A LoRA policy's final model, the adapter merged into the base (written after the last step)."""
        return self.path / self.MERGED

    def reward_plot(self) -> Path:
        return self.path / self.REWARD_PLOT

    # ---- per attempt -------------------------------------------------------------------------
    def attempt_dir(self, kind: str, attempt: int | str) -> Path:
        """``logs/attempt-N``, ``ready/attempt-N`` or ``heartbeat/attempt-N``."""
        return self.path / kind / f"attempt-{attempt}"

    def log_dir(self, attempt: int | str) -> Path:
        return self.attempt_dir(self.LOGS, attempt)

    def slurmrl_check_log(self, attempt: int | str) -> Path:
        return self.log_dir(attempt) / self.SLURMRL_CHECK_LOG

    def task_log(self, attempt: int | str, component: str, task: int | str) -> Path:
        return self.log_dir(attempt) / f"{component}.{task}.log"

    def ready_dir(self, attempt: int | str) -> Path:
        return self.attempt_dir(self.READY, attempt)

    def ready_file(self, attempt: int | str, component: str, task: int) -> Path:
        return self.ready_dir(attempt) / f"{component}.{task}"

    def phases_file(self, attempt: int | str) -> Path:
        """Start-up milestones of one attempt: ``<unix time> <what>`` per line (batch shell and programs)."""
        return self.log_dir(attempt) / self.PHASES

    def add_phase(self, attempt: int | str, what: str) -> None:
        phases.add_phase(self.phases_file(attempt), what)

    def read_phases(self, attempt: int | str) -> list[tuple[int, str]]:
        return [(p.time, p.what) for p in phases.read_phases(self.phases_file(attempt))]

    def waiting_file(self, attempt: int | str, component: str) -> Path:
        """Why ``component`` is not serving yet, one line (removed once it serves); FAILED quotes it."""
        return self.log_dir(attempt) / f"{component}.waiting"

    def ended_dir(self, attempt: int | str) -> Path:
        """The end records of an attempt's tasks (slurmrl.rundir.ended); the job script's abort reads them."""
        return self.log_dir(attempt) / self.ENDED

    def ended_file(self, attempt: int | str, component: str, task: int | str) -> Path:
        return self.ended_dir(attempt) / f"{component}.{task}"

    def worker_restart_dir(self, attempt: int | str, component: str, first_task: int) -> Path:
        """Where the tasks of one server spanning nodes (its first task ``first_task``) meet to restart as a
        whole (slurmrl.runtime.steps.worker_restart)."""
        return self.log_dir(attempt) / self.WORKER_RESTARTS / f"{component}.{first_task}"

    def heartbeat_file(self, attempt: int | str, component: str, task: int) -> Path:
        """Touched by a program's main loop (slurmrl.heartbeat); its supervisor watches the age."""
        return self.attempt_dir(self.HEARTBEAT, attempt) / f"{component}.{task}"

    def failed_file(self, attempt: int | str) -> Path:
        return self.log_dir(attempt) / self.FAILED

    def preempted_file(self, attempt: int | str) -> Path:
        return self.log_dir(attempt) / self.PREEMPTED

    def stopped_file(self, attempt: int | str) -> Path:
        return self.log_dir(attempt) / self.STOPPED

    def allreduce_address(self, attempt: int | str, step: str) -> Path:
        """Where the node check's all-reduce (step ``step``: ``<job id>.<step id>``) is hosted: ``<host> <port>``,
        written by its rank 0 (slurmrl.runtime.steps.probe_allreduce)."""
        return self.log_dir(attempt) / f".allreduce.{step}"

    def end_note(self, attempt: int | str) -> Path:
        return self.log_dir(attempt) / self.END

    def node_faults(self, attempt: int | str) -> Path:
        return self.log_dir(attempt) / self.NODE_FAULTS

    def batch_log(self, job_id: str) -> Path:
        return self.logs / f"batch-{job_id}.out"

    @staticmethod
    def pattern_problem(path: Path | str) -> str | None:
        """Why ``path`` cannot stand in sbatch's and srun's ``--output`` file-name patterns (None: it can).
        Slurm expands ``%`` there (``%j``, ``%t``, ...), a backslash turns every expansion off, and a
        line break or tab ends an ``#SBATCH`` line's value."""
        text = str(path)
        for bad, what in (("\n", "a line break"), ("\r", "a line break"), ("\t", "a tab"), ("\0", "a NUL"),
                          ("%", "'%' (Slurm expands it in log file names)"),
                          ("\\", "a backslash (Slurm then expands nothing in log file names)")):
            if bad in text:
                return f"the path {text[:80]!r} goes into Slurm's log file names; it cannot hold {what}"
        return None

    def batch_log_pattern(self) -> str:
        """sbatch's ``--output`` for the batch shell (``%j``: the job id)."""
        return f"{self.path}/{self.LOGS}/batch-%j.out"

    def array_batch_log_pattern(self) -> str:
        """A sweep's job array: each array task's batch log in its point's run dir (``%A_%a``)."""
        return f"{self.path}/{self.LOGS}/batch-%A_%a.out"

    def job_outputs(self) -> list[Path]:
        """What a job writes outside logs/attempt-N: stale once another job runs in the run dir."""
        return [self.path / name for name in self.JOB_OUTPUTS]

    def set_aside_dir(self, job_id: str) -> Path:
        return self.logs / f"job-{job_id}"

    def preflight_dir(self) -> Path:
        return self.path / self.PREFLIGHT

    def preflight_report(self, component: str, rank: int) -> Path:
        """The preflight probe's report for task ``rank`` of ``component`` (slurmrl.contract.probe_report)."""
        return self.preflight_dir() / f"{component}.{rank}.json"

    def preflight_reports(self) -> list[Path]:
        return sorted(self.preflight_dir().glob("*.json"))

    # ---- the benchmark's folder, RUN_DIR/benchmark (the job passes it to runtime.bench as --out) ----
    @staticmethod
    def benchmark_point_name(concurrency: int | None, input_len: int | None, output_len: int | None) -> str:
        """vllm bench serve's result for one point (per-request lists left out): ``c8-in512-out128.json``
        for the grid, ``trace-c8.json`` (``trace.json`` without a cap) for a trace replay."""
        if input_len is None or output_len is None:
            return "trace.json" if concurrency is None else f"trace-c{concurrency}.json"
        return f"c{concurrency}-in{input_len}-out{output_len}.json"

    def benchmark_dir(self) -> Path:
        return self.path / self.BENCHMARK

    def benchmark_summary(self) -> Path:
        return self.benchmark_dir() / self.BENCHMARK_SUMMARY

    def benchmark_plot(self) -> Path:
        return self.benchmark_dir() / self.BENCHMARK_PLOT

    def dynamo_data_dir(self, attempt: int | str, service: str) -> Path:
        """``dynamo/<service>-attempt-N``: etcd's ``--data-dir`` or NATS's JetStream store (``-sd``)."""
        return self.path / self.DYNAMO / f"{service}-attempt-{attempt}"

    def attempts(self) -> list[int]:
        """Attempt numbers that have a log or ready folder, in order."""
        found = set()
        for kind in (self.LOGS, self.READY):
            for d in (self.path / kind).glob("attempt-*"):
                suffix = d.name.removeprefix("attempt-")
                if suffix.isdigit():
                    found.add(int(suffix))
        return sorted(found)

    def ready_tasks(self, attempt: int | str, component: str) -> dict[int, Path]:
        """task -> ready file, for every task of ``component`` that is ready in ``attempt``."""
        out = {}
        for f in self.ready_dir(attempt).glob(f"{component}.*"):
            task = f.name.rsplit(".", 1)[-1]
            if task.isdigit():
                out[int(task)] = f
        return dict(sorted(out.items()))

    # ---- inside a job step -------------------------------------------------------------------
    @classmethod
    def from_env(cls, env=None) -> RunDir:
        """The run dir of the job this step belongs to (the script exports SLURMRL_RUN_DIR)."""
        return cls(job_env.run_dir_from_env(env))

    @staticmethod
    def attempt_from_env(env=None) -> str:
        return job_env.attempt_from_env(env)
