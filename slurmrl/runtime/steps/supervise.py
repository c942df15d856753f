"""A thin supervisor around the command a task function in job.sbatch runs.

    python -m slurmrl.runtime.steps.supervise NAME [--gpus FIRST:COUNT] [--ready URL [--ready-model NAME
                                              [--ready-instances N]]] -- COMMAND...

It prints the exact argv it runs, keeps only this task's GPU slice visible, starts COMMAND,
forwards signals to it, writes the task's ready file once ``URL`` answers (``http://H:P``: GET
/health is 200; ``tcp://H:P``: the port accepts; ``started``: at once, the task serves nothing;
with ``--ready-model NAME``: GET /v1/models lists NAME, and with ``--ready-instances N`` the
server's /health lists N ``generate`` endpoints of the namespace ``$DYN_NAMESPACE``: Dynamo's
frontend, whose /health answers 200 before any worker is there); with ``--ready-completion MODEL``
(and ``--ready-workers N``: vllm-router lists N workers) only once one completion through URL
returns a token (``slurmrl.runtime.steps.ready_check``: ready means serving),
and exits with COMMAND's exit code (128+N when a signal N ended it). When COMMAND ends, or the
supervisor is told to stop, every process COMMAND left behind is ended too (TERM, then KILL):
the supervisor is the subreaper of its tree, so orphans (vLLM's EngineCore, torchrun's workers,
multiprocessing trackers) come back to it instead of living on with a GPU. COMMAND runs under
``slurmrl.runtime.steps.guard``, which ends the tree if the supervisor itself is killed.
With ``--restart POLICY`` (a server; ``--max-restarts N``, ``--restart-backoff SECONDS``) a command that
dies is relaunched in place and made ready again (``slurmrl.runtime.steps.restart``), each death and
restart an event in RUN_DIR/events.jsonl; with ``--worker-tasks N`` the N tasks of a server spanning nodes
restart as a whole (``slurmrl.runtime.steps.worker_restart``).

The standard library and psutil only: this starts before any engine.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import psutil

from slurmrl import heartbeat
from slurmrl.contract import job_env
from slurmrl.contract.argv import Guard, Supervise
from slurmrl.rundir import ended, joined
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import write_ready
from slurmrl.runtime.steps import provenance, restart, tree
from slurmrl.runtime.steps import ready_check as ready_check_module
from slurmrl.runtime.steps.worker_restart import Worker
from slurmrl.runtime.vllm import client

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def log(name: str, msg: str) -> None:
    print(f"slurmrl: {name}.{os.environ.get('SLURM_PROCID', '0')} on {socket.gethostname()}: {msg}", flush=True)


# ---- readiness ---------------------------------------------------------------------------
def http_ok(url: str, timeout: float = 2.0) -> bool:
    return client.ask("GET", url, timeout=timeout).status == 200


def tcp_ok(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def get_json(url: str, timeout: float = 2.0):
    answer = client.ask("GET", url, timeout=timeout)
    try:
        return answer.json() if answer.status == 200 else None
    except ValueError:
        return None


def model_ok(base: str, model: str, instances: int = 0, namespace: str | None = None) -> bool:
    """``model`` is listed at BASE/v1/models and BASE/health lists ``instances`` workers (distinct
    instances serving a ``generate`` endpoint in ``namespace``): Dynamo's frontend is ready."""
    listed = get_json(f"{base}/v1/models")
    if not isinstance(listed, dict) or model not in {m.get("id") for m in listed.get("data") or []}:
        return False
    if instances <= 0:
        return True
    health = get_json(f"{base}/health")
    found = {
        i.get("instance_id") for i in (health or {}).get("instances") or []
        if i.get("endpoint") == "generate" and (namespace is None or i.get("namespace") == namespace)
    }
    return len(found) >= instances


def ready_check(url: str, model: str | None = None, instances: int = 0):
    """A callable that is true once ``url`` answers; the URL others reach the task at, or None."""
    if url == "started":
        return (lambda: True), None
    scheme, _, rest = url.partition("://")
    hostport = rest.split("/")[0]
    host, _, port = hostport.rpartition(":")
    if scheme not in ("http", "tcp") or not host or not port.isdigit():
        raise SystemExit(f"slurmrl: --ready {url!r}: give http://HOST:PORT, tcp://HOST:PORT or started")
    if scheme == "http" and model:
        namespace = os.environ.get("DYN_NAMESPACE")
        return (lambda: model_ok(f"http://{hostport}", model, instances, namespace)), f"http://{hostport}"
    if scheme == "http":
        return (lambda: http_ok(f"http://{hostport}/health")), f"http://{hostport}"
    return (lambda: tcp_ok(host, int(port))), f"tcp://{hostport}"


# ---- GPUs --------------------------------------------------------------------------------
def narrow_gpus(spec: str, env: MutableMapping[str, str]) -> list[str]:
    """Keep GPU positions FIRST..FIRST+COUNT-1 of what Slurm gave the step; returns the ids kept."""
    first, _, count = spec.partition(":")
    if not (first.isdigit() and count.isdigit() and int(count) > 0):
        raise SystemExit(f"slurmrl: --gpus {spec!r}: give FIRST:COUNT, e.g. 0:2")
    visible = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    lo, hi = int(first), int(first) + int(count)
    if hi > len(visible):
        raise SystemExit(
            f"slurmrl: this task wants GPU positions {lo}..{hi - 1} but the step sees "
            f"{','.join(visible) or 'no GPUs'} (CUDA_VISIBLE_DEVICES); check the srun GPU flags"
        )
    env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[lo:hi])
    return visible[lo:hi]


def add_cuda_runtime(env: dict) -> None:
    """Binaries such as mooncake_client link libcudart; outside a CUDA image it comes from a wheel."""
    try:
        import nvidia.cuda_runtime as cr
    except ImportError:
        return
    libs = [str(Path(p) / "lib") for p in cr.__path__]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, *filter(None, [env.get("LD_LIBRARY_PATH")])])


# ---- main ----------------------------------------------------------------------------------
def parse(argv: list[str]) -> Supervise[str]:
    return Supervise.parse(argv, description=__doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    env, check, url = prepare(args)
    tree.become_subreaper()
    try:
        provenance.record(args.name)  # RUN_DIR/lock.toml: this interpreter's versions (the first task only)
    except OSError as e:
        log(args.name, f"could not add the versions to the run dir's lock.toml: {e}")
    log(args.name, f"exec: {shlex.join(args.command)}")
    record = ended_file(args.name)
    guard = Guard(args.command, str(record) if record else None, bool(args.ready and args.ready != "started"),
                  args.fail_on)
    current = Current()
    asked = forward_signals(current)  # set once a stop was passed on
    hung = threading.Event()

    def start() -> subprocess.Popen:
        """The guard and its command, with their readiness and heartbeat watchers (again on a restart)."""
        hung.clear()
        child = current.child = subprocess.Popen([sys.executable, "-m", Guard.MODULE, *guard.to_argv()], env=env)
        if asked.is_set():  # a stop that came as it started (a restart): it was passed on to no one
            child.terminate()
        if check is not None:
            threading.Thread(target=mark_ready, args=(args.name, check, url, child), daemon=True).start()
        if args.heartbeat:
            threading.Thread(target=watch_heartbeat, args=(args.name, env[heartbeat.ENV], args.heartbeat, child, hung),
                             daemon=True).start()
        return child

    policy = args.restart_policy()
    if policy is None:
        code = restart.returned(start().wait())
    else:  # a server: restarted in place as its policy says, every death and restart recorded
        code, _ = restart.run(start, policy, asked, restart.Where.here(args.name), lambda m: log(args.name, m),
                              Worker.here(args.name, int(args.worker_tasks or 1)))
    if hung.is_set():
        code = HUNG
    if record:  # the guard wrote it, unless it was killed (a hang, a kill -9): then what is known here
        write_fallback(record, code, hung.is_set(), asked.is_set(), args)
    left = tree.end()
    if left:
        log(args.name, f"ended {len(left)} process(es) the command left behind: {' '.join(map(str, left))}")
    log(args.name, f"{args.command[0]} exited with code {code}")
    return code


class Current:
    """The guard now running (a restart replaces it): where forwarded signals go."""

    child: subprocess.Popen | None = None


def prepare(args: Supervise[str]) -> tuple[dict[str, str], Any, str | None]:
    """The command's environment (its GPUs, the CUDA runtime, the heartbeat file), and its readiness
    check with the URL it polls (None, None without ``--ready``)."""
    env = dict(os.environ)
    if args.gpus:
        log(args.name, f"GPUs {','.join(narrow_gpus(args.gpus, env))} (positions {args.gpus})")
    if args.cuda_runtime:
        add_cuda_runtime(env)
    check, url = ready_check(args.ready, args.ready_model, args.ready_instances or 0) if args.ready else (None, None)
    if check is not None and args.ready_completion and url and url.startswith("http://"):
        check = ready_check_module.Serving(args.name, url, args.ready_completion, int(args.ready_workers or 0), check)
    if args.heartbeat:
        env[heartbeat.ENV] = str(heartbeat_file(args.name))
        Path(env[heartbeat.ENV]).parent.mkdir(parents=True, exist_ok=True)  # watched from the first beat on
    return env, check, url


def forward_signals(current: Current) -> threading.Event:
    """Pass the signals in FORWARDED on to the running guard; the event is set once a stop (TERM, INT) was
    passed on (it also ends a restart's backoff)."""
    asked = threading.Event()

    def forward(signum, _frame):
        if signum in (signal.SIGTERM, signal.SIGINT):
            asked.set()
        child = current.child
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    return asked


HUNG = 124  # exit code when the command stopped beating


def heartbeat_file(name: str) -> Path:
    run_dir = RunDir.from_env().path
    return RunDir(run_dir).heartbeat_file(RunDir.attempt_from_env(), name, int(os.environ.get("SLURM_PROCID", "0")))


def ended_file(name: str) -> Path | None:
    """This task's end record (slurmrl.rundir.ended); None outside a job script (no SLURMRL_RUN_DIR)."""
    if not job_env.in_job():
        return None
    return RunDir.from_env().ended_file(RunDir.attempt_from_env(), name, int(os.environ.get("SLURM_PROCID", "0")))


def write_fallback(path: Path, code: int, hung: bool, asked: bool, args: Supervise[str]) -> None:
    """The end record when the guard left none (it was killed with its command)."""
    ntasks = int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or 1)
    if hung:
        rec = ended.record(code, "failed", f"hung: no heartbeat within {args.heartbeat}s (slurm.heartbeat_timeout)", ntasks)
    elif asked:
        rec = ended.record(code, "stopped", "", ntasks)
    else:
        rec = ended.record(code, "failed", f"ended with code {code} (its guard was killed)", ntasks)
    try:
        ended.write_ended(path, rec, replace=hung)
    except OSError as e:
        log(args.name, f"could not write the end record {path}: {e}")


def watch_heartbeat(name: str, path: str, timeout: int, child: subprocess.Popen, hung: threading.Event) -> None:
    """End the command when its heartbeat file is older than ``timeout`` seconds."""
    while child.poll() is None:
        age = heartbeat.age(path)
        if age is not None and age > timeout:
            log(name, f"no heartbeat for {age:.0f}s (limit {timeout}s): the command is hung; ending it")
            hung.set()
            try:
                for p in [psutil.Process(child.pid), *psutil.Process(child.pid).children(recursive=True)]:
                    p.kill()  # a stopped process does not act on TERM
            except psutil.NoSuchProcess:
                pass
            return
        time.sleep(min(5.0, max(timeout / 4, 0.2)))


def command_pid(guard: subprocess.Popen) -> int | None:
    """The command's pid: the guard's child."""
    try:
        kids = psutil.Process(guard.pid).children()
    except psutil.NoSuchProcess:
        return None
    return kids[0].pid if kids else None


def mark_ready(name: str, check, url: str | None, child: subprocess.Popen) -> None:
    """Poll ``check`` while the command runs; once true, write this task's ready file."""
    started = time.monotonic()
    while child.poll() is None:
        # the command's pid too: a check that passes at once (``started``) must not beat the guard's fork
        if check() and (command_pid(child) or time.monotonic() - started > 10):
            run_dir = RunDir.from_env().path
            task = int(os.environ.get("SLURM_PROCID", "0"))
            ntasks = int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or 1)
            write_ready(RunDir(run_dir).ready_file(RunDir.attempt_from_env(), name, task), url, ntasks,
                               command_pid(child))
            if joined.register_from_env(url, task):  # a joiner job's server: the main job's orchestrator finds it
                log(name, f"joined {os.environ[job_env.JOIN_RUN_DIR]}")
            log(name, f"ready{' at ' + url if url else ''}")
            return
        time.sleep(0.2 if url is None else 1)


if __name__ == "__main__":
    sys.stdout.flush()
    sys.exit(main())
