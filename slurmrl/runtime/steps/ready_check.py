"""Ready means serving: a front (vllm-router, Dynamo's frontend, or a server no router fronts) is
ready once its own check passes (/health), the expected number of workers is registered behind
it, and one real completion through it returns at least one token.

The task's supervisor (``slurmrl.runtime.steps.supervise --ready URL --ready-completion MODEL
[--ready-workers N]``) polls :class:`Serving`. Each milestone is logged and written to the
attempt's phases (``<name> workers registered``, ``<name> serving``), with the seconds it took.
While it is not serving, the reason (the front's answer and, when the completion fails through a
router, which worker fails it directly) is kept in ``logs/attempt-N/<name>.waiting``: the batch
shell puts it in the job's FAILED line when the component is not ready by its deadline.

Standard library only (the supervisor starts before any engine).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.vllm import client

PROMPT = "Hello"
MAX_TOKENS = 1  # one token says the engine serves; more only costs start-up time
TIMEOUT_S = 60.0  # a first completion may compile kernels
BLAME_EVERY_S = 30.0


def _request(url: str, body: dict | None = None, timeout: float = 5.0) -> tuple[int, str]:
    """(HTTP status, body text) of GET (``body`` None) or POST JSON; status 0 when nothing answered."""
    answer = client.ask("GET" if body is None else "POST", url, body, timeout)
    if answer.status == 0:
        return 0, str(answer.reason)
    return answer.status, answer.text


def _short(text: str, limit: int = 200) -> str:
    """One line of an answer, for a log line or FAILED."""
    try:  # OpenAI-style errors: {"error": {"message": ...}} or {"message": ...}
        doc = json.loads(text)
        err = doc.get("error", doc) if isinstance(doc, dict) else doc
        text = err.get("message", text) if isinstance(err, dict) else (err if isinstance(err, str) else text)
    except ValueError:
        pass
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def tokens_of(text: str) -> int | None:
    """Completion tokens in an OpenAI completion response: ``usage.completion_tokens``, else the
    length of ``choices[0].logprobs.tokens``/ the text being non-empty; None when it is no completion."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
        return None
    usage = doc.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return usage["completion_tokens"]
    choice = doc["choices"][0] if doc["choices"] else {}
    return 1 if isinstance(choice, dict) and choice.get("text") else 0


def completion(base: str, model: str, timeout: float = TIMEOUT_S) -> tuple[int, str]:
    """POST BASE/v1/completions (max_tokens=1) -> (tokens returned, "" ) or (0, why not)."""
    status, text = _request(f"{base}/v1/completions",
                            {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}, timeout)
    if status == 0:
        return 0, f"no answer ({_short(text)})"
    if status != 200:
        return 0, f"HTTP {status}: {_short(text)}"
    tokens = tokens_of(text)
    if tokens is None:
        return 0, f"HTTP 200 but no completion in the answer: {_short(text)}"
    if tokens < 1:
        return 0, "HTTP 200 with 0 completion tokens"
    return tokens, ""


def router_workers(base: str) -> list[str] | None:
    """The worker URLs vllm-router lists (GET /list_workers: ``{"urls": [...]}``), None when it does not answer."""
    return client.Server(base).list_workers()


class Serving:
    """A ready check: ``base_check()`` (the front's own), then ``workers`` registered (vllm-router's
    /list_workers; 0: not checked here), then one completion of ``model`` returning a token."""

    def __init__(self, name: str, url: str, model: str, workers: int, base_check,
                 env: dict | None = None, completion_timeout: float = TIMEOUT_S):
        self.name, self.url, self.model, self.workers = name, url.rstrip("/"), model, workers
        self.base_check = base_check
        self.env = os.environ if env is None else env
        self.timeout = completion_timeout
        self.started = time.monotonic()
        self.registered_at: float | None = None
        self.last_reason = ""
        self.known: list[str] = []  # worker URLs the router listed
        self.blamed: tuple[float, str] | None = None  # (when, what) of the last direct look at the workers

    # ---- reporting ---------------------------------------------------------------------------
    def _where(self) -> tuple[Path, str, str]:
        run_dir = RunDir.from_env(self.env).path
        return run_dir, RunDir.attempt_from_env(self.env), self.env.get("SLURM_PROCID", "0")

    def log(self, msg: str) -> None:
        print(f"slurmrl: {self.name}.{self.env.get('SLURM_PROCID', '0')} on {socket.gethostname()}: {msg}", flush=True)

    def phase(self, what: str) -> None:
        run_dir, attempt, _ = self._where()
        RunDir(run_dir).add_phase(attempt, what)

    def waiting(self, reason: str) -> None:
        """Keep why it is not ready yet (the batch shell reads it on timeout); log each new reason once."""
        if reason == self.last_reason:
            return
        self.last_reason = reason
        self.log(f"not serving yet: {reason}")
        run_dir, attempt, task = self._where()
        path = RunDir(run_dir).waiting_file(attempt, self.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{task}.tmp")
        tmp.write_text(f"task {task}: {reason}\n")
        tmp.replace(path)

    def done(self) -> None:
        run_dir, attempt, _ = self._where()
        RunDir(run_dir).waiting_file(attempt, self.name).unlink(missing_ok=True)

    # ---- the check -----------------------------------------------------------------------------
    def __call__(self) -> bool:
        if not self.base_check():
            self.waiting(f"{self.url} does not pass its health check yet")
            return False
        elapsed = time.monotonic() - self.started
        if self.registered_at is None:
            if self.workers > 0:
                listed = router_workers(self.url)
                if listed is None:
                    self.waiting(f"{self.url}/list_workers does not answer")
                    return False
                self.known = listed
                if len(listed) < self.workers:
                    self.waiting(f"{len(listed)} of {self.workers} workers registered at {self.url}")
                    return False
                what = f"{self.name} workers registered: {len(listed)} of {self.workers} after {elapsed:.0f}s"
                self.log(what)
                self.phase(what)
            self.registered_at = time.monotonic()
        t0 = time.monotonic()
        tokens, why = completion(self.url, self.model, self.timeout)
        took = time.monotonic() - t0
        if tokens < 1:
            blame = self.blame() if self.known else ""
            self.waiting(f"completion of {self.model!r} through {self.url}/v1/completions failed: {why}{blame}")
            return False
        what = (f"{self.name} serving: a completion through {self.url} returned {tokens} token(s) in {took:.1f}s "
                f"({time.monotonic() - self.started:.0f}s after its start)")
        self.log(what)
        self.phase(what)
        self.done()
        return True

    def blame(self) -> str:
        """A completion sent to each worker the router lists, directly: which of them fail it
        (at most every BLAME_EVERY_S: the check polls each second)."""
        if self.blamed is not None and time.monotonic() - self.blamed[0] < BLAME_EVERY_S:
            return self.blamed[1]
        bad = []
        for w in self.known:
            tokens, why = completion(w.rstrip("/"), self.model, self.timeout)
            if tokens < 1:
                bad.append(f"{w}: {why}")
        text = ("; directly, " + "; ".join(bad)) if bad else "; each worker answers directly"
        self.blamed = (time.monotonic(), text)
        return text
