"""The inner half of a task's supervision: run COMMAND, die with the supervisor, end COMMAND's tree.

    python -m slurmrl.runtime.steps.guard -- COMMAND...      (started by slurmrl.runtime.steps.supervise)

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
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading

from slurmrl.rundir.plain import PlainBytes
from slurmrl.runtime.steps import tree
from slurmrl.runtime.steps.planned_stop import StopTracebacks

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def main(argv: list[str]) -> int:
    if argv[:1] != ["--"] or len(argv) < 2:
        print("usage: python -m slurmrl.runtime.steps.guard -- COMMAND...", file=sys.stderr)
        return 2
    command = argv[1:]
    parent = os.getppid()
    tree.die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:  # the supervisor died before we could ask to follow it
        return 143
    tree.become_subreaper()
    outputs = plain_outputs()
    try:
        child = subprocess.Popen(command, preexec_fn=lambda: tree.die_with_parent(signal.SIGKILL), **outputs)
    except OSError as e:
        print(f"slurmrl: cannot start {command[0]}: {e.strerror}", file=sys.stderr, flush=True)
        return 127
    stopping = threading.Event()  # a stop was passed on: torchrun's SignalException tracebacks are left out
    name = os.path.basename(command[0])
    filters = {fd: StopTracebacks(stopping, name) for stream, fd in ((child.stdout, 1), (child.stderr, 2))
               if stream is not None}
    pumps = [threading.Thread(target=pump, args=(stream.fileno(), fd, filters[fd]), daemon=True)
             for stream, fd in ((child.stdout, 1), (child.stderr, 2)) if stream is not None]
    for t in pumps:
        t.start()

    def on_signal(signum, _frame):
        if os.getppid() != parent:  # PDEATHSIG: the supervisor is gone; nobody else will clean up
            tree.end(grace=5.0)
            os._exit(128 + signum)
        if signum in (signal.SIGTERM, signal.SIGINT):
            stopping.set()
        if child.poll() is None:
            child.send_signal(signum)

    for sig in FORWARDED:
        signal.signal(sig, on_signal)
    code = child.wait()
    left = tree.end()
    for t in pumps:  # what the command wrote last, then EOF (the tree that held the pipe is gone)
        t.join(timeout=10)
    dropped = [f.dropped for f in filters.values() if f.dropped]
    if code == 1 and dropped:  # torchrun's SignalException after a planned stop: the stop's code, not a failure
        code = 128 + dropped[-1]
    if left:
        print(f"slurmrl: ended {len(left)} process(es) {command[0]} left behind: {' '.join(map(str, left))}",
              flush=True)
    return code if code >= 0 else 128 - code


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


def pump(src: int, dest: int, tracebacks: StopTracebacks) -> None:
    """Copy ``src`` to ``dest`` until EOF, colour codes dropped, and after a planned stop torchrun's
    SignalException tracebacks (slurmrl.runtime.steps.planned_stop)."""
    strip = PlainBytes()
    while True:
        try:
            chunk = os.read(src, 1 << 16)
        except OSError:
            chunk = b""
        data = tracebacks.feed(strip.feed(chunk)) if chunk else tracebacks.feed(strip.flush()) + tracebacks.flush()
        while data:
            try:
                data = data[os.write(dest, data):]
            except OSError:
                return
        if not chunk:
            return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
