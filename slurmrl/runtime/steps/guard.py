"""The inner half of a task's supervision: run COMMAND, die with the supervisor, end COMMAND's tree.

    python -m slurmrl.runtime.steps.guard [--ended FILE] [--serves] [--fail-on REGEX]... -- COMMAND...
                                              (started by slurmrl.runtime.steps.supervise)

Two processes watch each command, so that no single ``kill -9`` leaves an orphan holding a GPU:
- the supervisor (outer) is the subreaper of everything below it and ends what is left when
  the guard exits;
- the guard (inner) is the subreaper of the command's tree, gets SIGTERM when the supervisor
  dies (``PR_SET_PDEATHSIG``) and then ends the tree itself; the command gets SIGKILL when the
  guard dies, and its children fall back to the supervisor.
Signals are forwarded to the command; the guard exits with the command's code (128+N for signal N).
When the step writes to a file (srun's --output, not a terminal), the command's output passes through
the guard, which drops terminal colour codes (slurmrl.rundir.plain): logs are plain text; and after a
stop it passed on, torchrun's SignalException tracebacks (slurmrl.runtime.steps.planned_stop).
The output is also read by the failure probes (slurmrl.runtime.steps.probes): a fatal one (CUDA out of
memory, NCCL, a model that is not there, vLLM's engine died, a ``--fail-on`` pattern) ends the command
at once. A command the kernel killed for a hardware error (SIGBUS) names its node bad in the
attempt's NODE_FAULTS: the script requeues the job without it. With ``--ended FILE`` the guard writes
the task's end record there (slurmrl.rundir.ended) the moment the command ends: when, its code, finished/stopped/failed and the cause; ``--serves``: the
command is a server, so ending without being asked to is a failure whatever its code. A failed task
never exits 0 (1 in place of 0), so srun and the script see the failure too.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

from slurmrl.contract import attempt_end, job_env
from slurmrl.contract.argv import Guard
from slurmrl.rundir import ended
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.plain import PlainBytes
from slurmrl.runtime.steps import killed, tree
from slurmrl.runtime.steps.planned_stop import StopTracebacks
from slurmrl.runtime.steps.probes import Probe, Probes, ProbeStream, Worker, user_probes

PROBE_GRACE_S = 30.0  # after a fatal probe: TERM, then KILL when the command is still there
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def parse(argv: list[str]) -> tuple[Guard, tuple[Probe, ...]] | None:
    """The command line (``slurmrl.contract.argv.Guard``) and its failure probes; None when it is not one."""
    args = Guard.parse(argv)
    if args is None:
        return None
    try:
        return args, user_probes(list(args.fail_on))
    except re.error as e:
        print(f"slurmrl: --fail-on {e.pattern!r}: not a regular expression ({e})", file=sys.stderr, flush=True)
        return None


def main(argv: list[str]) -> int:
    parsed = parse(argv)
    if parsed is None:
        print("usage: python -m slurmrl.runtime.steps.guard [--ended FILE] [--serves] [--fail-on REGEX]... -- COMMAND...",
              file=sys.stderr)
        return 2
    args, user = parsed
    command = list(args.command)
    parent = os.getppid()
    tree.die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:  # the supervisor died before we could ask to follow it
        return 143
    tree.become_subreaper()
    outputs = plain_outputs()
    oom_before = killed.oom_kills()  # the OOM kills in this task's memory cgroup so far
    try:
        child = subprocess.Popen(command, preexec_fn=lambda: tree.die_with_parent(signal.SIGKILL), **outputs)
    except OSError as e:
        print(f"slurmrl: cannot start {command[0]}: {e.strerror}", file=sys.stderr, flush=True)
        write_end(args, ended.record(127, "failed", f"cannot start {command[0]}: {e.strerror}", ntasks()))
        return 127
    run = Running(child, args, parent)
    probes = Probes(user, on_fatal=run.fatal)
    filters = {fd: StopTracebacks(run.stopping, run.name) for stream, fd in ((child.stdout, 1), (child.stderr, 2))
               if stream is not None}
    pumps = [threading.Thread(target=pump, args=(stream.fileno(), fd, filters[fd], probes.stream()), daemon=True)
             for stream, fd in ((child.stdout, 1), (child.stderr, 2)) if stream is not None]
    for t in pumps:
        t.start()
    for sig in FORWARDED:
        signal.signal(sig, run.on_signal)
    code = child.wait()
    at = ended.record(0, "finished").time_ns  # when it ended, before its leftovers are ended
    for t in pumps:  # its last words (a traceback) before the record; a child that holds the pipe: not long
        t.join(timeout=0.5)
    code = code if code >= 0 else 128 - code
    record = run.end_record(code, probes, at, oom_before)
    write_end(args, record)
    name_bad_node(args, code, probes.worker)  # the script reads it as the step ends
    left = tree.end()
    for t in pumps:  # what the command wrote last, then EOF (the tree that held the pipe is gone)
        t.join(timeout=10)
    code = exit_code(code, record, [f.dropped for f in filters.values() if f.dropped], run.probed.is_set())
    if left:
        print(f"slurmrl: ended {len(left)} process(es) {command[0]} left behind: {' '.join(map(str, left))}",
              flush=True)
    return code


class Running:
    """The command the guard runs, and how it is being ended: a stop passed on (``stopping``: torchrun's
    SignalException tracebacks are left out from then on), a fatal probe (``probed``)."""

    def __init__(self, child: subprocess.Popen, args: Guard, parent: int):
        self.child, self.args, self.parent = child, args, parent
        self.name = os.path.basename(args.command[0])
        self.stopping = threading.Event()
        self.probed = threading.Event()

    def fatal(self, cause: str) -> None:
        """A fatal probe matched (from a pump thread): end the command now."""
        if self.stopping.is_set():  # a planned stop is under way: what it says as it stops (NCCL, the engine) is not a failure
            return
        self.probed.set()
        print(f"slurmrl: failure probe: {cause}; ending {self.name}", file=sys.stderr, flush=True)
        self.stopping.set()  # what it prints as it stops (torchrun's SignalException) is our TERM's noise
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
            timer = threading.Timer(PROBE_GRACE_S, kill_if_alive, args=(self.child,))
            timer.daemon = True  # the guard exits when the command did, not 30 s later
            timer.start()

    def on_signal(self, signum, _frame) -> None:
        if os.getppid() != self.parent:  # PDEATHSIG: the supervisor is gone; nobody else will clean up
            write_end(self.args, ended.record(128 + signum, "failed", "killed with its supervisor", ntasks()),
                      replace=False)
            tree.end(grace=5.0)
            os._exit(128 + signum)
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.stopping.set()
        if self.child.poll() is None:
            self.child.send_signal(signum)

    def end_record(self, code: int, probes: Probes, at_ns: int, oom_before: int | None) -> ended.Ended:
        """The end record of the command that exited with ``code`` (128+N for signal N) at ``at_ns``."""
        worker = probes.worker
        sigkill = code == 128 + signal.SIGKILL or (worker is not None and worker.signal == signal.SIGKILL)
        oom = sigkill and oom_killed(oom_before, worker.pid if worker is not None and worker.signal else self.child.pid)
        return end_record(code, probes.fatal if self.probed.is_set() else None, probes.cause, self.stopping.is_set(),
                          self.args.serves, at_ns, worker, oom)


def exit_code(code: int, record: ended.Ended, dropped: list[int], probed: bool) -> int:
    """The guard's exit code for a command that exited with ``code``: after a planned stop, torchrun's
    SignalException (code 1, its traceback ``dropped``) is the stop's signal; a failed task never exits 0."""
    if code == 1 and dropped and not probed:
        return 128 + dropped[-1]
    if record.failed and code == 0:
        return 1  # ended by a failure probe, or a server that ended unasked: never a success (srun, the script see it)
    return code


def kill_if_alive(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()


def ntasks() -> int:
    return int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or 1)


# the exit codes of a command a signal ended (128 + SIGKILL, SIGSEGV, SIGBUS, SIGABRT, SIGTERM...)
KILLED = frozenset(128 + s for s in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGTERM,
                                     signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGFPE, signal.SIGILL))


def exit_cause(code: int) -> str:
    """An exit code in words: "exited with code 1", "exited with code 137 (SIGKILL)"."""
    if code > 128:
        try:
            return f"exited with code {code} ({signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return f"exited with code {code}"


def oom_killed(before: int | None, pid: int) -> bool:
    """Did the OOM killer end ``pid``: the task's cgroup counts one more OOM kill than when the command
    started, or the kernel log names the pid (slurmrl.runtime.steps.killed)."""
    after = killed.oom_kills()
    return (before is not None and after is not None and after > before) or killed.kernel_killed([pid])


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def end_record(code: int, fatal: str | None, found: str | None, stopping: bool, serves: bool, at_ns: int,
               worker: Worker | None = None, oom: bool = False) -> ended.Ended:
    """How the command ended: a fatal probe ended it (``fatal``), it was asked to stop, a signal ended it
    or (torchrun's ``worker``) one of its workers, it exited non-zero, a server ended on its own
    (whatever its code), or it finished; ``found``: what the probes said (a traceback, a note); ``oom``:
    the SIGKILL was the OOM killer's. How the process ended comes first: a traceback it logged and
    lived on after (a /metrics scrape that went away) is never the cause of a kill."""
    if fatal:
        state, cause = "failed", fatal
    elif stopping:
        state, cause = "stopped", ""
    elif code in KILLED:  # a signal ended it: that is the cause, not a traceback it logged and served on
        said = killed.signal_cause("SIGKILL", True) + f" (exit code {code})" if oom else exit_cause(code)
        state, cause = "failed", said + (f"; the last traceback it logged: {found}" if found else "")
    elif worker is not None and worker.signal is not None:  # torchrun's worker: killed, whatever it logged
        how = killed.signal_cause(signal_name(worker.signal), oom and worker.signal == signal.SIGKILL)
        state, cause = "failed", f"worker rank {worker.rank} (pid {worker.pid}) {how}"
    elif worker is not None and worker.code and not found:
        state, cause = "failed", f"worker rank {worker.rank} (pid {worker.pid}) exited with code {worker.code}"
    elif code != 0:
        state, cause = "failed", found or exit_cause(code)
    elif serves:
        state, cause = "failed", found or "exited with code 0 while serving, though nothing asked it to stop"
    else:
        state, cause = "finished", ""
    return ended.record(code, state, cause, ntasks(), at_ns)


def name_bad_node(args: Guard, code: int, worker: Worker | None) -> None:
    """The kernel killed the command (or torchrun's worker) for a hardware error (SIGBUS): its node is
    bad, not the job. Named in the attempt's NODE_FAULTS, the script excludes it and requeues the job
    (slurmrl.contract.attempt_end)."""
    why = attempt_end.hardware_fault(code)
    if why is None and worker is not None and worker.signal is not None:
        why = attempt_end.hardware_fault(128 + worker.signal)
    if why is None or not job_env.in_job():
        return
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    task = Path(args.ended).name if args.ended else " ".join(args.command[:1])
    where = RunDir(job_env.run_dir_from_env()).node_faults(job_env.attempt_from_env())
    try:
        attempt_end.append_fault(where, node, f"{task} {why}")
    except OSError as e:
        print(f"slurmrl: could not name {node} bad in {where}: {e}", file=sys.stderr, flush=True)
        return
    print(f"slurmrl: {node}: {task} {why}: the node is bad, the job requeues without it", file=sys.stderr, flush=True)


def write_end(args: Guard, record: ended.Ended, replace: bool = True) -> None:
    if not args.ended:
        return
    try:
        ended.write_ended(Path(args.ended), record, replace=replace)
    except OSError as e:
        print(f"slurmrl: could not write the end record {args.ended}: {e}", file=sys.stderr, flush=True)


def plain_outputs() -> dict:
    """Popen's stdout/stderr: pipes through the guard when the step's output is a file (one pipe when
    stdout and stderr are the same file, so their order is kept); {} on a terminal or a pipe."""
    try:
        out, err = os.fstat(1), os.fstat(2)
    except OSError:
        return {}
    files = [s for s in (out, err) if stat.S_ISREG(s.st_mode)]
    if not files:
        return {}
    if os.path.samestat(out, err):
        return {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
    return {"stdout": subprocess.PIPE if stat.S_ISREG(out.st_mode) else None,
            "stderr": subprocess.PIPE if stat.S_ISREG(err.st_mode) else None}


def pump(src: int, dest: int, tracebacks: StopTracebacks, probes: ProbeStream | None = None) -> None:
    """Copy ``src`` to ``dest`` until EOF, colour codes dropped, and after a planned stop torchrun's
    SignalException tracebacks (slurmrl.runtime.steps.planned_stop); ``probes`` read what is written."""
    strip = PlainBytes()
    while True:
        try:
            chunk = os.read(src, 1 << 16)
        except OSError:
            chunk = b""
        data = tracebacks.feed(strip.feed(chunk)) if chunk else tracebacks.feed(strip.flush()) + tracebacks.flush()
        out = data
        while out:
            try:
                out = out[os.write(dest, out):]
            except OSError:
                break
        if probes is not None:  # after the line is in the log: a fatal probe's own line follows it
            probes.feed(data)
            if not chunk:
                probes.flush()
        if not chunk or out:
            return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
