"""Failures named by their cause (issue 26 item 3, issue 27 item 8):

- the probe matcher (slurmrl.runtime.steps.probes) reads a task's output: a Python traceback is its
  exception line and the frame to blame ("ZeroDivisionError in env.py:36: division by zero"); CUDA
  out of memory, NCCL errors, a model that is not there and the recipe's fail_on patterns are fatal;
  torchrun's and vLLM's line prefixes, wrapper exceptions and any split of the stream into chunks
  change nothing;
- end records (slurmrl.rundir.ended) round-trip and refuse what is not one in one line;
- the real step supervisor and guard (no Slurm) write the record: a raising program is failed with its
  exception, a server that exits 0 on its own is failed, a stop it was asked for is stopped, a fatal
  probe ends a command that would have run on;
- `slurmrl status` drops a task that ended from the endpoints and lists it dead with its cause, and
  `status --watch` exits 0 only for a run that finished.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from supervised_commands import PY, ROOT, probe, supervise

from slurmrl.app import status as status_mod
from slurmrl.app import status_text
from slurmrl.app.status_read import report
from slurmrl.app.status_report import StatusReport
from slurmrl.errors import UserError
from slurmrl.rundir import ended
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import write_ready
from slurmrl.slurm.watch import Snapshot

TRACEBACK = '''Traceback (most recent call last):
  File "/work/my-rl/run.py", line 12, in <module>
    main()
  File "/work/my-rl/env.py", line 36, in reward
    return 1 / len(answers)
           ~~^~~~~~~~~~~~~~
ZeroDivisionError: division by zero
'''


@pytest.mark.parametrize(("text", "cause"), [
    (TRACEBACK, "ZeroDivisionError in env.py:36: division by zero"),
    ("step 1 reward 0.5\n" + TRACEBACK + "more output\n", "ZeroDivisionError in env.py:36: division by zero"),
    # torchrun's and vLLM's prefixes in front of every line of a process
    ("".join(f"[rank0]: {ln}\n" for ln in TRACEBACK.splitlines()), "ZeroDivisionError in env.py:36: division by zero"),
    ("".join(f"(EngineCore_DP0 pid=4242) {ln}\n" for ln in TRACEBACK.splitlines()),
     "ZeroDivisionError in env.py:36: division by zero"),
    (TRACEBACK.replace("\n", "\r\n"), "ZeroDivisionError in env.py:36: division by zero"),
    # the innermost frame of the user's code, not the library that raised
    ('Traceback (most recent call last):\n  File "/home/u/env.py", line 7, in score\n    json.loads(x)\n'
     '  File "/usr/lib/python3.12/json/__init__.py", line 346, in loads\n    return _default_decoder.decode(s)\n'
     'json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n',
     "JSONDecodeError in env.py:7: Expecting value: line 1 column 1 (char 0)"),
    # a chain: the first exception is the cause
    (TRACEBACK + "\nDuring handling of the above exception, another exception occurred:\n\n"
     'Traceback (most recent call last):\n  File "/work/my-rl/run.py", line 14, in <module>\n    raise RuntimeError("x")\n'
     "RuntimeError: x\n", "ZeroDivisionError in env.py:36: division by zero"),
    # an exception without a message, without frames
    ('Traceback (most recent call last):\n  File "a.py", line 1, in <module>\nKeyboardInterrupt\n',
     "KeyboardInterrupt in a.py:1"),
    # torchrun's ChildFailedError only wraps the worker's: the worker's is the cause
    (TRACEBACK + 'Traceback (most recent call last):\n  File "/x/site-packages/torch/run.py", line 9, in main\n'
     "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n", "ZeroDivisionError in env.py:36"),
    ('Traceback (most recent call last):\n  File "/x/site-packages/torch/run.py", line 9, in main\n'
     "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n", None),
    ('Traceback (most recent call last):\n  File "/x/api.py", line 9, in main\n'
     "torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15\n", None),
    ("all fine\nstep 3 loss 0.1\n", None),
    ("", None),
    ("Traceback (most recent call last):\n", None),  # cut off before its exception
])
def test_a_traceback_names_the_cause(text, cause):
    p, fired = probe(text)
    assert p.cause == cause or (cause is not None and p.cause is not None and p.cause.startswith(cause)), p.cause
    assert fired == []  # none of these ends the task by itself


@pytest.mark.parametrize(("line", "cause"), [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB", "CUDA out of memory"),
    ("RuntimeError: CUDA error: out of memory", "CUDA out of memory"),
    ("torch.distributed.DistBackendError: NCCL error in: ../ProcessGroupNCCL.cpp:1970, unhandled system error",
     "NCCL error"),
    ("misc/socket.cc:484 NCCL WARN ... ncclSystemError: System call (e.g. socket, malloc) or external library call failed",
     "NCCL error"),
    ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE)", "NCCL error"),
    ("OSError: /models/nope is not a local folder and is not a valid model identifier listed on "
     "'https://huggingface.co/models'", "model not found: /models/nope"),
    ("huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
     "'/models/a/b/c'. Use `repo_type` argument if needed.", "model not found: /models/a/b/c"),
    ("ValueError: Invalid repository ID or local directory specified: '/scratch/m'.", "model not found: /scratch/m"),
    ("ERROR 11-25 [core_client.py:564] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
     "vLLM's engine process died"),
    ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", "vLLM's engine process died"),
])
def test_fatal_probes_end_the_task_at_once(line, cause):
    for text in (line + "\n", "[rank3]: " + line + "\n", 'Traceback (most recent call last):\n'
                 '  File "/w/train.py", line 5, in step\n    x.backward()\n' + line + "\n"):
        p, fired = probe(text + TRACEBACK)  # a later traceback does not replace it
        assert p.cause is not None and p.cause.startswith(cause), (text, p.cause)
        assert fired == [p.fatal] and p.fatal == p.cause
    located, _ = probe('Traceback (most recent call last):\n  File "/w/train.py", line 5, in step\n    x()\n' + line + "\n")
    assert located.cause is not None and located.cause.endswith("in train.py:5")


def test_the_recipes_patterns_are_fatal_and_quote_the_line():
    p, fired = probe("ok\nreward server said: quota exceeded for key 7\nmore\n", patterns=("quota exceeded",))
    assert fired == [p.cause] and p.cause == "log matched fail_on 'quota exceeded': reward server said: quota exceeded for key 7"
    p, fired = probe("nothing here\n", patterns=("quota exceeded",))
    assert fired == [] and p.cause is None


def test_a_line_without_an_end_is_cut_not_held():
    p, _ = probe("x" * (1 << 18) + "\rCUDA out of memory\n")
    assert p.cause == "CUDA out of memory"


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
       prefix=st.sampled_from(["", "[rank1]: ", "(EngineCore_DP0 pid=9) "]),
       noise=st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40), max_size=5))
def test_any_split_of_the_stream_finds_the_same_cause(chunks, prefix, noise):
    clean = [n.replace("\r", " ").replace("\n", " ") for n in noise]
    clean = [n for n in clean if "Traceback" not in n and "Error" not in n and "error" not in n and "NCCL" not in n
             and "nccl" not in n and "Engine" not in n and "died" not in n]
    text = "".join(f"{n}\n" for n in clean) + "".join(f"{prefix}{ln}\n" for ln in TRACEBACK.splitlines())
    p, _ = probe(text, chunks=chunks)
    assert p.cause == "ZeroDivisionError in env.py:36: division by zero"


# ---- end records --------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(t=st.integers(min_value=0, max_value=2**62), code=st.integers(min_value=-255, max_value=255),
       state=st.sampled_from(ended.STATES), n=st.integers(min_value=1, max_value=10**6), cause=st.text(max_size=400))
def test_an_end_record_round_trips_as_one_line(tmp_path_factory, t, code, state, n, cause):
    path = tmp_path_factory.mktemp("e") / "x.0"
    ended.write_ended(path, ended.Ended(t, code, state, n, cause))
    assert path.read_text().count("\n") == 1
    got = ended.read_ended(path)
    assert got is not None and (got.time_ns, got.code, got.state, got.ntasks) == (t, code, state, n)
    assert got.cause == ended.one_line(cause) and len(got.cause) <= ended.MAX_CAUSE


@pytest.mark.parametrize("content", [b"\0\0\0", b"12 1 exploded 1 x\n", b"12 1\n", b"twelve 1 failed 1 x\n",
                                     b"12 x failed 1 y\n", b"12 1 failed many y\n", b"9" * 30 + b" 1 failed 1 y\n"])
def test_what_is_not_an_end_record_is_one_line_naming_the_file(tmp_path, content):
    path = tmp_path / "router.0"
    path.write_bytes(content)
    with pytest.raises(UserError, match="router.0"):
        ended.read_ended(path)


def test_the_first_failure_is_the_earliest_failed_record_and_the_first_writer_wins(tmp_path):
    assert ended.read_ended(tmp_path / "none.0") is None
    (tmp_path / "empty.0").write_text("")  # being written
    ended.write_ended(tmp_path / "orchestrator.0", ended.Ended(300, 1, "failed", 1, "VLLMError in loop.py:9"))
    ended.write_ended(tmp_path / "inference.2", ended.Ended(200, 137, "failed", 4, "exited with code 137 (SIGKILL)"))
    ended.write_ended(tmp_path / "trainer.0", ended.Ended(100, 143, "stopped", 1, ""))
    assert not ended.write_ended(tmp_path / "inference.2", ended.Ended(500, 0, "failed", 4, "later"), replace=False)
    found = ended.first_failure(ended.read_all(tmp_path))
    assert found is not None
    name, task, rec = found
    assert ended.who(name, task, rec) == "inference.2" and rec.cause.startswith("exited with code 137")
    assert ended.who("orchestrator", 0, ended.Ended(1, 1, "failed", 1, "")) == "orchestrator"
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


# ---- the real supervisor and guard, no Slurm ----------------------------------------------------------
def test_a_program_that_raises_is_failed_with_its_exception(tmp_path):
    env_py = tmp_path / "env.py"
    env_py.write_text("import sys\n\n\ndef reward(x):\n    return 1 / x\n\n\nprint('step 1', flush=True)\nreward(0)\n")
    code, log, rec = supervise(tmp_path, "orchestrator", [PY, str(env_py)])
    assert code == 1 and "ZeroDivisionError: division by zero" in log  # the log keeps the traceback
    assert rec is not None and rec.state == "failed" and rec.code == 1
    assert rec.cause == "ZeroDivisionError in env.py:5: division by zero"



def test_a_server_killed_after_it_logged_a_traceback_is_named_by_the_signal(tmp_path):
    """vLLM logs a traceback for a request whose client went away and serves on; kill -9 later is the
    cause (the kill matrix found the traceback named instead)."""
    script = ("import os, signal\ntry:\n    raise ConnectionResetError(104, 'Connection reset by peer')\n"
              "except Exception:\n    import traceback; traceback.print_exc()\n"
              "print('serving on', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)")
    code, log, rec = supervise(tmp_path, "inference", [PY, "-c", script], "--ready", "http://127.0.0.1:9")
    assert "ConnectionResetError" in log and rec is not None and rec.state == "failed" and rec.code == 137
    assert rec.cause.startswith("exited with code 137 (SIGKILL); the last traceback it logged: ConnectionResetError")

def test_a_server_that_exits_0_on_its_own_is_dead(tmp_path):
    """vLLM's API server exits 0 when its engine dies: a server's end it was not asked for is a failure,
    and the engine's death in its log is the cause (and would have ended it at once)."""
    code, _, rec = supervise(tmp_path, "inference", [PY, "-c", "pass"], "--ready", "http://127.0.0.1:9")
    assert rec is not None and rec.state == "failed" and rec.code == 0 and "while serving" in rec.cause
    assert code == 1  # srun (its --kill-on-bad-exit) and the script see a failure too
    script = ("import time\nprint('Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.', flush=True)"
              "\ntime.sleep(600)")
    code, _, rec = supervise(tmp_path, "router", [PY, "-c", script], "--ready", "tcp://127.0.0.1:9")
    assert rec is not None and rec.state == "failed" and rec.cause == "vLLM's engine process died" and code != 0


def test_what_a_command_says_as_it_stops_is_not_a_failure(tmp_path):
    """After a planned stop's TERM, an NCCL error as the peers go is teardown noise: stopped, not failed."""
    script = ("import signal, sys, time\n"
              "def bye(*_):\n    print('torch.distributed.DistBackendError: NCCL error in: x.cpp:1', flush=True)\n"
              "    sys.exit(1)\n"
              "signal.signal(signal.SIGTERM, bye)\nprint('up', flush=True)\ntime.sleep(600)")
    code, log, rec = supervise(tmp_path, "trainer", [PY, "-c", script], stop_after=0, wait_for="up")
    assert rec is not None and rec.state == "stopped" and "failure probe" not in log, log


def test_a_program_that_finishes_or_is_stopped_did_not_fail(tmp_path):
    code, _, rec = supervise(tmp_path, "trainer", [PY, "-c", "print('done')"])
    assert code == 0 and rec is not None and rec.state == "finished" and rec.cause == ""
    script = "import time\nprint('up', flush=True)\ntime.sleep(60)"
    code, _, rec = supervise(tmp_path, "inference", [PY, "-c", script], "--ready", "http://127.0.0.1:9",
                             stop_after=0, wait_for="up")
    assert code == 143 and rec is not None and rec.state == "stopped"


@pytest.mark.parametrize(("line", "opts", "cause"), [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", (), "CUDA out of memory"),
    ("reward api: quota exceeded", ("--fail-on", "quota exc.*"), "log matched fail_on 'quota exc.*'"),
])
def test_a_fatal_probe_ends_a_command_that_would_run_on(tmp_path, line, opts, cause):
    script = f"import time\nprint({line!r}, flush=True)\ntime.sleep(600)"
    started = time.monotonic()
    code, log, rec = supervise(tmp_path, "trainer", [PY, "-c", script], *opts)
    assert time.monotonic() - started < 300  # it did not sleep out its 600 s: the probe ended it
    assert code != 0 and f"failure probe: {cause}" in log
    assert rec is not None and rec.state == "failed" and rec.cause.startswith(cause)


# ---- status ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def replicas(tmp_path_factory) -> Path:
    from slurmrl.cli import main

    run_dir = tmp_path_factory.mktemp("s") / "replicas"
    assert main(["render", str(ROOT / "recipes" / "inference-replicas.toml"), "--run-dir", str(run_dir)]) == 0
    return run_dir


def serving_report(run_dir: Path, records: dict[int, ended.Ended], state: str = "RUNNING") -> StatusReport:
    paths = RunDir(run_dir)
    for task in range(16):
        write_ready(paths.ready_file(0, "inference", task), f"http://n{task // 4 + 1}:{8100 + task % 4}", 16, 100 + task)
    write_ready(paths.ready_file(0, "router", 0), "http://n1:8000", 1, 99)
    for f in paths.ended_dir(0).glob("*"):
        f.unlink()
    for task, rec in records.items():
        ended.write_ended(paths.ended_file(0, "inference", task), rec)
    paths.add_phase(0, "allocation: job 7 attempt 0")
    snap = Snapshot("7", state, parts=[])
    return report(snap, run_dir, status_mod.load_plan(run_dir))


def test_a_dead_server_is_shown_dead_and_left_out_of_the_endpoints(replicas):
    killed = ended.Ended(10, 137, "failed", 16, "exited with code 137 (SIGKILL)")
    quiet = ended.Ended(20, 0, "failed", 16, "vLLM's engine process died")
    typed = serving_report(replicas, {2: killed, 5: quiet})
    rep = typed.to_json()  # what --json prints
    urls = {e["url"] for e in rep["endpoints"] if e["component"] == "inference"}
    assert len(urls) == 14 and "http://n1:8102" not in urls and "http://n2:8101" not in urls
    inference = {c["name"]: c for c in rep["components"]}["inference"]
    assert 2 not in inference["ready"] and 5 not in inference["ready"] and len(inference["ready"]) == 14
    assert [(d["task"], d["cause"]) for d in inference["dead"]] == [(2, killed.cause), (5, quiet.cause)]
    shown = status_text.text(typed)
    assert "  dead: inference.2 exited with code 137 (SIGKILL)" in shown
    assert "  dead: inference.5: vLLM's engine process died" in shown
    assert "14/16 (ranks 0,1,3,4,6,7,8,9,10,11,12,13,14,15; dead: 2,5)" in shown
    json.dumps(rep)  # --json prints the same report


def test_a_stopped_task_is_not_dead_but_serves_no_more(replicas):
    typed = serving_report(replicas, {0: ended.Ended(10, 143, "stopped", 16, "")})
    inference = {c.name: c for c in typed.components}["inference"]
    assert inference.dead == [] and 0 not in inference.ready
    assert "dead:" not in status_text.text(typed)
    typed = serving_report(replicas, {})
    assert typed.serving_url == "http://n1:8000" and len(typed.endpoints) == 17


@pytest.mark.parametrize(("state", "failed", "stopped", "done"), [
    ("COMPLETED", None, None, True),
    ("COMPLETED", None, "warning signal: stopped before the end, not requeued: slurm.requeue is off", False),
    ("COMPLETED", "trainer: CUDA out of memory", None, False),
    ("FAILED", None, "warning signal: stopped before the end, not requeued: slurm.max_requeues", False),
    ("TIMEOUT", None, None, False),
    ("CANCELLED", None, None, False),
])
def test_watch_exits_0_only_for_a_run_that_finished(state, failed, stopped, done):
    assert StatusReport(Snapshot("7", state), failed=failed, stopped=stopped).finished() is done


# ---- our own programs' last line, and environments that do not load ------------------------------------
@pytest.mark.parametrize(("line", "cause"), [
    ("slurmrl: environment 'pkg.envs:Env' with arguments {}: ZeroDivisionError in env.py:3: division by zero",
     "environment 'pkg.envs:Env' with arguments {}: ZeroDivisionError in env.py:3: division by zero"),
    ("slurmrl: cannot load environment 'nothere:Env': ModuleNotFoundError: No module named 'nothere'",
     "cannot load environment 'nothere:Env': ModuleNotFoundError: No module named 'nothere'"),
    ("slurmrl: orchestrator: sampling failed: http://n1:8000: connection refused",
     "sampling failed: http://n1:8000: connection refused"),
    ("slurmrl: orchestrator: scoring failed: judge answered 500", "scoring failed: judge answered 500"),
    ("slurmrl: orchestrator: fewer than inference.min_servers = 1 servers live for 300s: http://n2:8001 (task 0) dead: "
     "/health: [Errno 111] Connection refused; http://n2:8002 (task 1) dead: /health: [Errno 111] Connection refused",
     "fewer than inference.min_servers = 1 servers live for 300s: http://n2:8001 (task 0) dead: /health: [Errno 111] "
     "Connection refused; http://n2:8002 (task 1) dead: /health: [Errno 111] Connection refused"),
    ("slurmrl: trainer stopped on signal 15 as asked (a planned stop); its 2 SignalException traceback(s) left out", None),
    ("slurmrl: orchestrator.0 on n1: exec: python -m x", None),
])
def test_our_programs_last_line_is_the_cause_when_no_traceback_says_more(line, cause):
    p, fired = probe(f"step 1\n{line}\n")
    assert p.cause == cause and fired == []
    if cause is not None:  # a traceback says more
        assert probe(f"{line}\n{TRACEBACK}")[0].cause == "ZeroDivisionError in env.py:36: division by zero"


@pytest.mark.parametrize(("source", "said"), [
    ("class Env:\n    def __init__(self):\n        self.n = 1 / 0\n", "ZeroDivisionError in {mod}.py:3: division by zero"),
    ("import json\nx = {}['missing']\n", "KeyError in {mod}.py:2: 'missing'"),
    (None, "ModuleNotFoundError: No module named '{mod}'"),
])
def test_an_environment_that_does_not_load_says_where(tmp_path, monkeypatch, source, said):
    from slurmrl import envs

    mod = f"env_{abs(hash((str(tmp_path), source))) % 10**8}"
    if source is not None:
        (tmp_path / f"{mod}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as e:
        envs.load(f"{mod}:Env")
    assert said.format(mod=mod) in str(e.value.code) and "\n" not in str(e.value.code)
