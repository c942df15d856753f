"""Planned stops leave no tracebacks (issue 27 item 8): after the guard passed on a stop (TERM/INT),
torchrun's chain of SignalException tracebacks is one line in the step's log and the guard exits with
the signal's code (143), not torchrun's 1; any other traceback, and any traceback before a stop, is
written as it was."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from slurmrl.runtime.steps.planned_stop import StopTracebacks

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN_TAIL = b"""W1125 agent/server/api.py:753] Received 15 death signal, shutting down workers
Traceback (most recent call last):
  File "/venv/torch/distributed/elastic/agent/server/api.py", line 745, in run
    result = self._invoke_run(role)
             ^^^^^^^^^^^^^^^^^^^^^^
  File "/venv/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 10372 got signal: 15

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.api.SignalException: Process 10372 got signal: 15
slurmrl: trainer.0: stopped after step 2 (checkpoint complete); exit 143
"""
LOGGING_BLOCK = b"""--- Logging error ---
Traceback (most recent call last):
  File "/usr/lib/python3.12/logging/__init__.py", line 1163, in emit
    stream.write(msg + self.terminator)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 10372 got signal: 15
Call stack:
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
Message: 'Sending process %s closing signal %s'
Arguments: (10380, 'SIGTERM')
"""
OTHER = b"""Traceback (most recent call last):
  File "x.py", line 1, in <module>
ValueError: a real failure
"""


def filtered(data: bytes, stop: bool = True, cuts=(64,)) -> tuple[bytes, StopTracebacks]:
    ev = threading.Event()
    if stop:
        ev.set()
    f, out, i = StopTracebacks(ev, "torchrun"), b"", 0
    for n in list(cuts) * (len(data) // max(sum(cuts), 1) + 1):
        out += f.feed(data[i:i + n])
        i += n
    return out + f.feed(data[i:]) + f.flush(), f


def test_torchruns_chain_after_a_stop_is_one_line():
    out, f = filtered(TORCHRUN_TAIL)
    assert b"Traceback" not in out and b"SignalException" in out and f.dropped == 15
    assert out.startswith(b"W1125 agent") and out.endswith(b"exit 143\n")
    assert b"slurmrl: torchrun stopped on signal 15 as asked (a planned stop); its 2 SignalException" in out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=20),
       st.sampled_from([b"", b"partial line without a newline", b"Trace"]))
def test_the_filter_does_not_depend_on_where_reads_cut(cuts, tail):
    whole, _ = filtered(TORCHRUN_TAIL + LOGGING_BLOCK + OTHER + tail, cuts=(1 << 20,))
    cut, _ = filtered(TORCHRUN_TAIL + LOGGING_BLOCK + OTHER + tail, cuts=cuts)
    assert cut == whole and whole.endswith(b"exit 143\n" + OTHER + tail) and b"Logging error" not in whole


def test_other_tracebacks_and_tracebacks_before_a_stop_are_kept():
    assert filtered(OTHER)[0] == OTHER
    assert filtered(TORCHRUN_TAIL, stop=False)[0] == TORCHRUN_TAIL
    mixed = TORCHRUN_TAIL.replace(b"torch.distributed.elastic.multiprocessing.api.SignalException: Process 10372 "
                                  b"got signal: 15\nslurmrl", b"KeyError: 'x'\nslurmrl")
    assert filtered(mixed)[0] == mixed


FAKE_TORCHRUN = r"""
import os, signal, sys, time
class SignalException(Exception):
    pass
def handler(signum, frame):
    raise SignalException(f"Process {os.getpid()} got signal: {signum}")
signal.signal(signal.SIGTERM, handler)
print("\x1b[32mready\x1b[0m", flush=True)
try:
    time.sleep(60)
except SignalException:
    raise SignalException(f"Process {os.getpid()} got signal: 15")
"""


def stopped_under_the_guard(tmp_path: Path, script: str) -> tuple[int, str]:
    """Run ``script`` under the real guard, its output to a file as srun gives it; TERM once it is ready."""
    log = tmp_path / "trainer.0.log"
    with log.open("w") as out:
        p = subprocess.Popen([sys.executable, "-m", "slurmrl.runtime.steps.guard", "--", sys.executable, "-c",
                              script], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 30
        while "ready" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=30)
    text = log.read_text()
    return code, text


def test_the_guard_leaves_torchruns_tracebacks_out_of_the_log_after_a_stop(tmp_path):
    code, text = stopped_under_the_guard(tmp_path, FAKE_TORCHRUN)
    assert "Traceback" not in text and text.startswith("ready\n"), text
    assert "stopped on signal 15 as asked (a planned stop)" in text, text
    assert code == 143


LOGGING_TORCHRUN = r"""
import logging, os, signal, sys, time
class SignalException(Exception):
    pass
stopping = []
class Stream:  # the TERM lands inside a log call's write, as it does in torchrun's agent
    def write(self, text):
        if stopping:
            raise SignalException(f"Process {os.getpid()} got signal: 15")
        sys.stderr.write(text)
    def flush(self):
        sys.stderr.flush()
logging.basicConfig(stream=Stream(), level=logging.INFO)
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
print("ready", flush=True)
while not stopping:
    time.sleep(0.05)
logging.getLogger("torch.distributed.elastic").info("Sending process %s closing signal %s", os.getpid(), "SIGTERM")
print("after the log call", flush=True)
raise SignalException(f"Process {os.getpid()} got signal: 15")
"""


def test_a_logging_error_of_the_stops_signal_leaves_no_fragment(tmp_path):
    """Real logging's "--- Logging error ---" block (its traceback, "Call stack:", "Message:", "Arguments:")
    of a SignalException raised inside a log call: after a stop, left out whole, not in fragments around
    the line that says the traceback was left out."""
    code, text = stopped_under_the_guard(tmp_path, LOGGING_TORCHRUN)
    for fragment in ("Logging error", "Call stack:", "Message: ", "Arguments: ", "Traceback", "  File "):
        assert fragment not in text, text
    assert "after the log call" in text and "stopped on signal 15 as asked" in text and code == 143, text
    # the same block before a stop, or of another error, is kept whole
    real = subprocess.run([sys.executable, "-c", LOGGING_TORCHRUN.replace("while not stopping:\n    time.sleep(0.05)",
                                                                          "stopping.append(1)")],
                          capture_output=True, text=True, timeout=30).stderr.encode()
    assert real.startswith(b"--- Logging error ---") and b"Arguments: " in real
    assert filtered(real, stop=False)[0] == real
    kept = real.replace(b"SignalException: Process", b"KeyError: Process")
    assert filtered(kept)[0] == kept
    block = real[:real.index(b"\n", real.index(b"Arguments: ")) + 1]  # the logging error alone
    dropped, f = filtered(block + b"next line\n", cuts=(7,))
    assert dropped == b"next line\n" and f.logging_dropped == 1 and f.dropped == 15
