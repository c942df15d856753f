"""One Python process with vLLM imported, shared by the tests that check rendered command lines with
vLLM's own argument parsers (conftest's session fixture ``vllm_python``).

Importing vLLM costs ~10 s on two cores; five test files each paid it in a ``python -c SCRIPT``
process of their own. Here each SCRIPT runs in the one process instead, as ``__main__`` with its own
``sys.argv``, stdin, stdout and stderr, and answers like ``subprocess.run(..., text=True)``:
``returncode`` (SystemExit's code, 1 for an uncaught exception, whose traceback ends stderr),
``stdout`` and ``stderr``. The scripts only parse command lines, which leaves nothing behind in vLLM.

Run as a program it is that process: one JSON request a line on stdin
(``{"code", "argv", "stdin"}``), one JSON answer a line on the stdout it started with; what vLLM
itself prints (its logger holds the original stdout) goes to stderr.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WARM = ("vllm.engine.arg_utils", "vllm.entrypoints.launchers.cli_args", "vllm.utils.argparse_utils")


def _run_one(code: str, argv: list[str], stdin: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv, sys.stdin
    sys.argv, sys.stdin = ["-c", *argv], io.StringIO(stdin)
    rc = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                exec(compile(code, "<vllm_python>", "exec"), {"__name__": "__main__"})
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
            except BaseException:  # the script's failure is its answer
                traceback.print_exc()
                rc = 1
    finally:
        sys.argv, sys.stdin = saved
    return {"returncode": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}


def serve() -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything written to fd 1 from here on (vLLM's logger) is not an answer
    sys.stdout = os.fdopen(1, "w", buffering=1)
    import importlib

    for name in WARM:
        importlib.import_module(name)
    answers.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        answers.write(json.dumps(_run_one(req["code"], req.get("argv", []), req.get("stdin", ""))) + "\n")


class VllmPython:
    """The client: ``run(code, *argv, input=...)`` -> a CompletedProcess, like ``subprocess.run``."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log.open("wb"), text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.lock = threading.Lock()
        self._read(600)

    def _read(self, timeout: float) -> dict:
        timer = threading.Timer(timeout, self.proc.kill)
        timer.start()
        try:
            line = self.proc.stdout.readline()
        finally:
            timer.cancel()
        if not line:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"the vLLM parser process ended (rc={self.proc.poll()}):\n{tail}")
        return json.loads(line)

    def run(self, code: str, *argv: str, input: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
        with self.lock:
            self.proc.stdin.write(json.dumps({"code": code, "argv": list(argv), "stdin": input}) + "\n")
            self.proc.stdin.flush()
            got = self._read(timeout)
        return subprocess.CompletedProcess(["vllm_python", *argv], got["returncode"], got["stdout"], got["stderr"])

    def close(self) -> None:
        """Killed: it holds nothing to save, and vLLM's exit takes seconds."""
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


if __name__ == "__main__":
    serve()
