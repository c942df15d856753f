"""The cause of a failure comes from how the process ended (issue 36 item 1).

A trainer worker the kernel killed was reported as "BrokenPipeError in exposition.py:96": the last
traceback in its log came from the /metrics server's thread after a scrape was abandoned. Here, with
the real supervisor and guard (and real torchrun):
- a traceback that a thread, a request handler or logging printed, the process living on, is never a
  cause; the one that ended the main thread still is;
- torchrun's record of its first failed worker names the signal that ended it ("worker rank 0 (pid N)
  killed by SIGKILL"), whatever the worker logged before;
- the OOM killer is named where the task's memory cgroup counts its kills (files laid out as the
  kernel's, since nothing here may fill the machine's memory) or the kernel log names the pid;
- /metrics prints nothing when a scraper goes away mid-request.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time

import pytest
from supervised_commands import PY, probe, supervise
from supervised_processes import free_port

from slurmrl.app.plot import training_line
from slurmrl.app.status_report import ComponentStatus, DeadTask
from slurmrl.app.status_text import shown_state
from slurmrl.contract import attempt_end
from slurmrl.contract.metrics import OrchestratorRow
from slurmrl.rundir import ended
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime import exposition
from slurmrl.runtime.steps import guard, killed
from slurmrl.slurm.watch import Step

THREAD_TRACEBACK = '''Exception in thread metrics-0 (serve):
Traceback (most recent call last):
  File "/usr/lib/python3.12/socketserver.py", line 697, in process_request_thread
    self.finish_request(request, client_address)
  File "/work/slurmrl/runtime/exposition.py", line 96, in do_GET
    self.wfile.write(body)
BrokenPipeError: [Errno 32] Broken pipe
'''
REQUEST_TRACEBACK = THREAD_TRACEBACK.replace("Exception in thread metrics-0 (serve):",
                                             "-" * 40 + "\nException occurred during processing of request from "
                                             "('10.0.0.7', 51234)").replace("BrokenPipeError: [Errno 32] Broken pipe",
                                                                           "ConnectionResetError: [Errno 104] reset")
LOGGING_ERROR = '''--- Logging error ---
Traceback (most recent call last):
  File "/usr/lib/python3.12/logging/__init__.py", line 1163, in emit
    stream.write(msg + self.terminator)
RuntimeError: reentrant call inside <_io.BufferedWriter name='<stderr>'>
Call stack:
  File "/work/x/run.py", line 3, in <module>
Message: 'closing'
'''
MAIN = '''Traceback (most recent call last):
  File "/work/my-rl/train.py", line 9, in <module>
    step()
ValueError: bad batch
'''
TORCHRUN_ROOT = '''torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-27_10:00:01
  host      : node1
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 5151)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_10:00:00
  host      : node1
  rank      : 3 (local_rank: 0)
  exitcode  : -9 (pid: 4242) (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================
'''


ASYNCIO = THREAD_TRACEBACK.replace("Exception in thread metrics-0 (serve):",
                                   "Exception in callback Server.scrape()\nhandle: <Handle Server.scrape()>")


@pytest.mark.parametrize("lived_on", [THREAD_TRACEBACK, REQUEST_TRACEBACK, LOGGING_ERROR, ASYNCIO])
def test_a_traceback_the_process_lived_on_after_is_no_cause(lived_on):
    p, _ = probe("step 1\n" + lived_on + "step 2\n")
    assert p.cause is None
    p, _ = probe(lived_on + "step 2\n" + MAIN)  # the main thread's end still is
    assert p.cause == "ValueError in train.py:9: bad batch"
    chained = lived_on + "\nDuring handling of the above exception, another exception occurred:\n\n" + MAIN
    assert probe(chained)[0].cause is None  # the chain is the thread's too


def test_torchruns_root_cause_names_the_worker_and_its_signal():
    p, _ = probe(THREAD_TRACEBACK + "".join(f"[rank0]: {ln}\n" if ln else "\n" for ln in TORCHRUN_ROOT.splitlines()))
    assert p.worker is not None and (p.worker.rank, p.worker.code, p.worker.pid, p.worker.signal) == (3, -9, 4242, 9)
    rec = guard.end_record(1, None, p.cause, False, False, 0, p.worker, oom=False)
    assert rec.state == "failed" and rec.cause == "worker rank 3 (pid 4242) killed by SIGKILL"
    rec = guard.end_record(1, None, p.cause, False, False, 0, p.worker, oom=True)
    assert rec.cause == "worker rank 3 (pid 4242) killed by the OOM killer (SIGKILL)"
    rec = guard.end_record(137, None, None, False, False, 0, None, oom=True)
    assert rec.cause == "killed by the OOM killer (SIGKILL) (exit code 137)"


KILLED_WITH_A_THREAD_TRACEBACK = """
import os, signal, threading, time
def scrape():
    raise BrokenPipeError(32, 'Broken pipe')
t = threading.Thread(target=scrape, name='metrics-0')
t.start(); t.join()
print('step 1 done', flush=True)
time.sleep(0.5)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_process_killed_with_9_is_named_by_the_signal_not_its_threads_traceback(tmp_path):
    code, log, rec = supervise(tmp_path, "trainer", [PY, "-c", KILLED_WITH_A_THREAD_TRACEBACK])
    assert "Exception in thread metrics-0" in log and "BrokenPipeError" in log  # the log keeps it
    assert code == 137 and rec is not None and rec.state == "failed"
    assert rec.cause == "exited with code 137 (SIGKILL)", rec.cause


def test_a_command_the_kernel_killed_with_sigbus_names_its_node_bad(tmp_path, monkeypatch):
    """A real SIGBUS (how the kernel ends a task whose memory a machine check took away): the task failed,
    and its node is named in the attempt's NODE_FAULTS, which the script excludes and requeues without."""
    monkeypatch.setenv("SLURMD_NODENAME", "n3")
    code, log, rec = supervise(tmp_path, "trainer", [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGBUS)"])
    assert code == 135 and rec is not None and rec.state == "failed"
    assert rec.cause == "exited with code 135 (SIGBUS)", rec.cause
    faults = attempt_end.read_faults(RunDir(tmp_path / "run").node_faults(0))
    assert list(faults) == ["n3"], faults
    assert faults["n3"].startswith("trainer.0 killed by the kernel for a hardware error (SIGBUS"), faults
    assert "n3: trainer.0 killed by the kernel for a hardware error" in log


def test_a_command_killed_otherwise_names_no_node(tmp_path):
    code, _, rec = supervise(tmp_path, "trainer", [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    assert code == 139 and rec is not None and not RunDir(tmp_path / "run").node_faults(0).exists()


def test_a_torchrun_worker_killed_with_9_is_named_by_the_signal(tmp_path):
    """Real torchrun (CPU, one worker): the worker's thread dies with a traceback, then the worker is
    killed with -9; torchrun exits 1 and its record of the worker is the cause."""
    worker = tmp_path / "train.py"
    worker.write_text(KILLED_WITH_A_THREAD_TRACEBACK)
    code, log, rec = supervise(tmp_path, "trainer", [PY, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                                                      "--master-port", str(free_port()), str(worker)])
    assert "BrokenPipeError" in log and "Root Cause" in log, log[-3000:]
    assert code == 1 and rec is not None and rec.state == "failed"
    assert rec.cause.startswith("worker rank 0 (pid ") and rec.cause.endswith(") killed by SIGKILL"), rec.cause


@pytest.mark.parametrize("version", [1, 2])
def test_the_oom_killer_is_read_from_the_tasks_memory_cgroup(tmp_path, version):
    """Files laid out as the kernel's (cgroup v1 memory.oom_control, v2 memory.events); a path the
    container does not show falls back to its nearest parent that is there."""
    root = tmp_path / "cgroup"
    if version == 1:
        proc = "4:memory:/slurm/uid_1/job_7/step_0/task_0\n1:cpu:/\n"
        f = root / "memory" / "slurm" / "uid_1" / "job_7" / "memory.oom_control"
        text = "oom_kill_disable 0\nunder_oom 0\noom_kill {}\n"
    else:
        proc = "0::/system.slice/slurmstepd.scope/job_7/step_0\n"
        f = root / "system.slice" / "slurmstepd.scope" / "job_7" / "step_0" / "memory.events"
        text = "low 0\nhigh 0\nmax 3\noom 1\noom_kill {}\noom_group_kill 0\n"
    f.parent.mkdir(parents=True)
    (tmp_path / "self-cgroup").write_text(proc)
    f.write_text(text.format(0))
    before = killed.oom_kills(root, tmp_path / "self-cgroup")
    f.write_text(text.format(1))
    assert (before, killed.oom_kills(root, tmp_path / "self-cgroup")) == (0, 1)
    assert killed.oom_kills(root, tmp_path / "missing") is None


def test_this_machines_counters_and_kernel_log_read_without_error():
    """On this machine: the count is a number where the cgroup is readable, and the kernel log names no
    OOM kill of a pid that never existed."""
    count = killed.oom_kills()
    assert count is None or count >= 0
    assert killed.kernel_killed([2 ** 22 + 7]) is False


def test_metrics_prints_nothing_when_a_scraper_goes_away(tmp_path):
    """A scraper that resets its connection mid-request (the collector's timeout): no traceback."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom slurmrl.runtime import exposition\n"
         f"exp, _ = exposition.serve('trainer', {port}, '127.0.0.1')\nexp.update({{'loss': 1.0}})\n"
         "print('up', flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        with socket.create_connection(("127.0.0.1", port)) as s:  # and it still serves
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            time.sleep(0.3)
            assert b"slurmrl_trainer_loss 1.0" in s.recv(65536)
    finally:
        server.kill()
        _, err = server.communicate(timeout=10)
    assert "Traceback" not in err and "Error" not in err, err
    assert isinstance(exposition.Server.daemon_threads, bool)


# ---- a planned stop is not a failure (issue 36 item 2), status of an RL job (item 5) -----------------------
def component(state: str | None, torn_down: bool = False, stopped: bool = False, dead: bool = False) -> ComponentStatus:
    step = Step("7.0", "x", 0, state, "15:0", "", "") if state else None
    return ComponentStatus("x", 0, step=step, torn_down=torn_down, stopped=stopped,
                           dead=[DeadTask(0, 1, "x")] if dead else [])


@pytest.mark.parametrize(("c", "shown"), [
    (component("FAILED", torn_down=True), "stopped by the script"),  # the collector in a COMPLETED job
    (component("CANCELLED by 1000", torn_down=True), "stopped by the script"),
    (component("FAILED", stopped=True), "stopped as asked"),  # the router after salloc's cancel: no teardown phase
    (component("FAILED", torn_down=True, dead=True), "FAILED"),  # it failed on its own before the teardown
    (component("FAILED"), "FAILED"),
    (component("COMPLETED", torn_down=True), "COMPLETED"),
    (component(None), "not started"),
])
def test_a_planned_stop_reads_as_stopped_never_failed(c, shown):
    assert shown_state(c) == shown


def test_every_task_asked_to_stop_is_a_planned_stop():
    stop, fail = ended.Ended(1, 143, "stopped", 2, ""), ended.Ended(1, 1, "failed", 2, "x")
    assert ended.all_stopped({("router", 0): stop, ("router", 1): stop}, "router")
    assert not ended.all_stopped({("router", 0): stop, ("router", 1): fail}, "router")
    assert not ended.all_stopped({("trainer", 0): stop}, "router")


def test_status_shows_the_environments_turns_errors_and_timeouts():
    line = training_line(OrchestratorRow.from_json({"step": 3, "reward_mean": 0.5, "env/turns_mean": 2.25,
                                                    "env/errors": 1, "env/timeouts": 0, "env/cut": 2}, 3), None)
    assert line is not None and line.endswith(", env turns 2.25, errors 1, timeouts 0, cut 2"), line
    assert "env" not in (training_line(OrchestratorRow.from_json({"step": 3, "reward_mean": 0.5}, 3), None) or "")
