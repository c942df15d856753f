"""Scoring through the job's judge: batched HTTP requests with a timeout, retries, and latency figures.

The orchestrator builds one ``JudgeClient`` from ``--judge-urls`` (the judge's ready files) and the
``judge`` table of its settings, and hands it to the environment (``use_judge``). An environment
scores with ``score(items)`` (each item a dict: ``completion``, ``prompt`` and the task's fields,
rendered through ``judge.template``) or ``score_texts(texts)``:

- ``generative``: ``POST /v1/completions`` with ``batch_size`` prompts per request, greedy,
  ``max_tokens``; the reward is the first number of each reply clamped to 0..max_score, over
  max_score (no number: 0, counted in ``judge/unparsed``).
- ``reward_model``: ``POST /classify`` (vLLM's pooling runner) with ``batch_size`` texts per request
  and no activation; the reward is the model's score (one class).

A step's requests go out at once, at most two per judge server, starting at the next server in
turn. A request that fails for a reason that may pass (connection refused or reset, a timeout,
HTTP 429 or 5xx, a reply cut short) is tried again on the next server after 1, 2, 4, ... s (at most
30 s), ``retries`` times; then the client waits up to ``wait_s`` (the judge's startup timeout) for a
judge server's ``/health`` to answer (a server that died is restarted by its supervisor) and tries
once more, ``retries`` times; then ``JudgeError`` names the judge and
the last failure, and the orchestrator exits with it. Any other HTTP error (a 4xx: a text longer than the judge's context, a
wrong model name) fails at once. The requests (and the job's secret) go through
``slurmrl.runtime.vllm.client``.
"""

from __future__ import annotations

import itertools
import re
import string
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from slurmrl.contract.metrics import JudgeStats
from slurmrl.envs.protocol import Environment
from slurmrl.runtime.vllm.client import Answer, Server
from slurmrl.settings.judge import JudgeSettings

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
MAX_BACKOFF_S = 30.0
PER_SERVER = 2  # requests in flight per judge server: vLLM batches what arrives together


class JudgeError(Exception):
    """The judge could not score: down, refusing, or answering something else than scores."""


def parse_score(text: str, max_score: float) -> float | None:
    """The first number of a judge's reply, clamped to 0..max_score and over max_score; None without one."""
    m = NUMBER.search(text)
    if m is None:
        return None
    return min(max(float(m.group()), 0.0), max_score) / max_score


def placeholders(template: str) -> list[str]:
    """The field names ``template`` fills, in order (the recipe checked that it has only plain names)."""
    names = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name and name not in names:
            names.append(name)
    return names


class JudgeClient:
    def __init__(self, urls: list[str], settings: JudgeSettings, headers: dict[str, str] | None = None,
                 backoff_s: float = 1.0):
        if not urls:
            raise JudgeError("no judge URL (the job script passes --judge-urls from the judge's ready files)")
        self.urls = [u.rstrip("/") for u in urls]
        self.s, self.headers, self.backoff_s = settings, dict(headers or {}), backoff_s
        self.fields = placeholders(settings.template)
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=PER_SERVER * len(self.urls), thread_name_prefix="judge")
        self._reset()

    def _reset(self) -> None:
        self._latency: list[float] = []
        self._retries = self._unparsed = self._scored = 0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- what environments call ------------------------------------------------------------
    def render(self, item: dict) -> str:
        """``judge.template`` filled from one item (``completion``, ``prompt``, the task's fields)."""
        missing = [f for f in self.fields if f not in item]
        if missing:
            raise JudgeError(f"judge.template: placeholder {{{missing[0]}}} is not a field of the task; it has "
                             f"{', '.join('{' + k + '}' for k in sorted(item))}")
        return self.s.template.format_map({f: item[f] for f in self.fields})

    def score(self, items: list[dict]) -> list[float]:
        """One reward per item, in order."""
        return self.score_texts([self.render(i) for i in items])

    def score_texts(self, texts: list[str]) -> list[float]:
        """One reward per text the judge reads as it is, in order."""
        size = self.s.batch_size
        futures = [self._pool.submit(self._batch, texts[i:i + size]) for i in range(0, len(texts), size)]
        out: list[float] = []
        for f in futures:
            out += f.result()
        return out

    def take_stats(self) -> JudgeStats:
        """Figures since the last call, for the step's metrics: requests, their latency, retries,
        replies without a score (generative), samples scored."""
        with self._lock:
            lat, retries, unparsed, scored = self._latency, self._retries, self._unparsed, self._scored
            self._reset()
        return JudgeStats(requests=len(lat), scored=scored, retries=retries, unparsed=unparsed,
                          latency_mean_s=sum(lat) / len(lat) if lat else 0.0, latency_max_s=max(lat, default=0.0))

    # ---- one request -----------------------------------------------------------------------
    def _batch(self, texts: list[str]) -> list[float]:
        s = self.s
        if s.kind == "generative":
            body = {"model": s.served_model_name, "prompt": texts, "max_tokens": s.max_tokens, "temperature": 0.0}
            url, reply = self._post("/v1/completions", body)
            try:
                choices = sorted(reply["choices"], key=lambda c: c["index"])
                replies = [c["text"] for c in choices]
            except (KeyError, TypeError) as e:
                raise JudgeError(f"judge {url} answered /v1/completions without choices ({e!r})") from None
            scores = [parse_score(t, s.max_score) for t in replies]
            unparsed = sum(x is None for x in scores)
            rewards = [0.0 if x is None else x for x in scores]
        else:
            body = {"model": s.served_model_name, "input": texts, "use_activation": False}
            url, reply = self._post("/classify", body)
            try:
                data = sorted(reply["data"], key=lambda d: d["index"])
                classes = {len(d["probs"]) for d in data}
                rewards = [float(d["probs"][0]) for d in data]
            except (KeyError, TypeError, IndexError, ValueError) as e:
                raise JudgeError(f"judge {url} answered /classify without scores ({e!r})") from None
            if classes != {1}:
                raise JudgeError(f"judge {url}: the reward model returns {sorted(classes)} classes per text; slurmrl "
                                 "reads one score (a sequence-classification model with num_labels = 1)")
            unparsed = 0
        if len(rewards) != len(texts):
            raise JudgeError(f"judge {url} returned {len(rewards)} scores for {len(texts)} texts")
        with self._lock:
            self._unparsed += unparsed
            self._scored += len(rewards)
        return rewards

    def _post(self, path: str, body: dict, waited: bool = False) -> tuple[str, dict]:
        first, tries = next(self._turn), self.s.retries + 1
        last = ""
        for attempt in range(tries):
            url = self.urls[(first + attempt) % len(self.urls)]
            t = time.perf_counter()
            answer = Server(url).ask("POST", path, body, timeout=self.s.timeout, headers=self.headers)
            if answer.ok:
                try:
                    reply = answer.json()
                    with self._lock:
                        self._latency.append(time.perf_counter() - t)
                    return url, reply
                except ValueError as e:  # a reply cut short
                    answer = Answer(answer.url, 0, error=e)
            if answer.status and not answer.transient:
                raise JudgeError(f"judge {url} refused {path}: HTTP {answer.status}: {' '.join(answer.said().split())}")
            if answer.status:
                last = f"{url}: HTTP {answer.status}: {' '.join(answer.said().split())}"
            else:
                reason = answer.reason
                last = f"{url}: {type(reason).__name__}: {reason}" if str(reason) else f"{url}: {type(reason).__name__}"
                if isinstance(reason, TimeoutError) or isinstance(answer.error, TimeoutError):
                    last += f" (no answer within judge.timeout = {self.s.timeout} s)"
            if attempt + 1 < tries:
                with self._lock:
                    self._retries += 1
                time.sleep(min(self.backoff_s * 2**attempt, MAX_BACKOFF_S))
        if not waited and self._back(last):
            return self._post(path, body, waited=True)
        raise JudgeError(f"judge did not answer {path} after {tries} tries ({', '.join(self.urls)}); last: {last}")


    def _back(self, last: str) -> bool:
        """Whether a judge server's ``/health`` answers 200 within ``wait_s`` (a dead one being restarted)."""
        if not self.s.wait_s:
            return False
        print(f"slurmrl: orchestrator: the judge does not answer ({last}); waiting up to {self.s.wait_s:g}s for it",
              flush=True)
        deadline = time.monotonic() + self.s.wait_s
        while time.monotonic() < deadline:
            if any(Server(u).health(timeout=2.0) for u in self.urls):
                return True
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        return False


def attach(env, urls: list[str], settings: JudgeSettings | None,
           headers: dict[str, str] | None = None) -> JudgeClient | None:
    """The job's judge handed to the environment (``use_judge``); None when the job has none."""
    if settings is None and not urls:
        return None
    if settings is None or not urls:
        raise JudgeError("the orchestrator has --judge-urls but no judge settings, or the other way round: "
                         "job.sbatch and components/orchestrator.toml disagree (was one edited?)")
    env = Environment.of(env)
    if not env.has("use_judge"):
        raise JudgeError(f"the environment {env.label} has no use_judge(judge) method, so it cannot score "
                         "through the job's [judge]")
    client = JudgeClient(urls, settings, headers)
    env.use_judge(client)
    return client
