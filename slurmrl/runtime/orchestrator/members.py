"""The live set of a job's inference servers: who takes rollouts now, who is dead, who came back.

The orchestrator starts with every server of the job (``--admin-urls``) admitted; its requests go to
``--requests-url`` (the router, or the servers themselves). Each server is in one state:

- ``healthy``: admitted since the start; ``readmitted``: admitted again after it came back.
- ``dead``: a request to it failed and its ``GET /health`` did not answer 200 within ``PROBE_S``, or the
  monitor's probes (every ``PROBE_S``) missed it ``MISSES`` times in a row. It gets no request: vllm-router
  (0.1.17) keeps a dead worker on its list (its retries send a refused request to a survivor, its health
  checker marks it unhealthy and takes it back by itself once it answers, with the base model's weights),
  so a dead server is taken off the router (``POST /remove_worker``) the moment it is declared dead.
- ``restarting``: a dead server whose ``/health`` answers again (its supervisor restarted it in place, same
  URL). It is still not asked: ``readmit`` first loads the weights the others serve into it (the weight
  strategy's ``admit``), then admits it (and gives it back to the router, ``POST /add_worker``), so no
  sample comes from a policy older than the others', whatever steps it missed. With a broadcast, ``admit``
  says False until the trainer's next update has reached it: it stays ``restarting`` until then.
- ``joining``, then ``joined``: a server of another job (``join``; ``slurmrl.runtime.orchestrator.joiners``
  finds them), admitted by ``readmit`` as a returning server is; when it stops answering it has ``left``
  (its job ended or was preempted: an event, not a fault) and is forgotten. ``min_servers`` counts every
  admitted server, joined ones too.

A request whose server failed for a reason that may pass (no answer, HTTP 429 or 5xx; or its server was declared
dead while it was in flight: a hung server is not waited for) is sent again, whole
(every completion of its prompt group, or the whole conversation), to a live server directly; the failure
costs nothing but time and is counted (``resent``). With no server admitted, a request waits for one; when
fewer than ``min_servers`` are admitted for longer than ``grace_s`` (the time a restarted server may take),
``Quorum`` is raised: its message names every dead server and why. Every ``dead`` and ``readmitted`` is an
event in the run dir (``slurmrl.contract.events``). Every change of state rewrites the live set
(``live``: ``slurmrl.contract.live_set``), which a broadcasting trainer reads before every update to form its
transfer group over the servers that are admitted or waiting. Every probe and request has a deadline.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from slurmrl.contract import live_set
from slurmrl.contract.events import Event, append
from slurmrl.contract.job_env import attempt_from_env
from slurmrl.rundir.ended import one_line
from slurmrl.runtime.vllm.client import Answer, Server, VLLMError

PROBE_S = 2.0  # a server's /health must answer within this; the monitor probes this often
MISSES = 2  # the monitor's probes in a row a server may miss before it is declared dead
WAIT_POLL_S = 0.5
CAUSE_CHARS = 60  # of each dead server's cause in the quorum's line (FAILED keeps 300 characters: rundir.ended)
T = TypeVar("T")
Log = Callable[[str], None]
ADMITTED = ("healthy", "readmitted", "joined")


class Quorum(RuntimeError):
    """Fewer than ``min_servers`` servers were live for longer than the deadline."""


@dataclass
class Member:
    url: str
    task: int  # the server's index among the job's servers (its task)
    state: str = "healthy"
    cause: str = ""  # why it was declared dead
    since: float = 0.0
    misses: int = 0
    job_id: str = ""  # a joined server's own job ("": one of this job's servers)
    incarnation: int = 0  # times it came back (a restarted server: same URL, a new process)
    gone: threading.Event = field(default_factory=threading.Event)  # set when declared dead (a new one on return)

    @property
    def admitted(self) -> bool:
        return self.state in ADMITTED


def transient(e: VLLMError) -> bool:
    """A failure another server may not have: nothing answered, HTTP 429 or 5xx."""
    return e.answer is not None and e.answer.transient


def probe(url: str, timeout: float = PROBE_S) -> str:
    """Why ``url`` is not live ('' when its ``/health`` answers 200 within ``timeout``)."""
    answer = Server(url).ask("GET", "/health", timeout=timeout)
    if answer.status == 200:
        return ""
    return f"/health answered HTTP {answer.status}" if answer.status else f"/health: {answer.reason or answer.error}"


class Members:
    """The job's servers (``servers``: every one, in task order) behind ``front`` (where requests go: the
    router, or the servers themselves). ``admit(url)`` loads the current weights into a server that came back
    (True: done); ``events``: the run dir's events file (None: not recorded)."""

    def __init__(self, servers: list[str], front: list[str], *, min_servers: int, grace_s: float,
                 events: Path | None, log: Log, stop: threading.Event | None = None, probe_s: float = PROBE_S,
                 live: Path | None = None):
        """``live``: where the live set is written at every change (``slurmrl.contract.live_set``; None: not)."""
        self.members = {u: Member(u, i, since=time.time()) for i, u in enumerate(servers)}
        self.front = list(front)
        extra = [u for u in front if u not in self.members]
        self.router = extra[0] if extra else None
        self.min_servers, self.grace_s, self.events, self.log, self.probe_s = min_servers, grace_s, events, log, probe_s
        self.admit: Callable[[str], bool] = lambda url: False  # the weight strategy's (the orchestrator sets it)
        self.lock = threading.RLock()
        self.admitting = threading.Lock()  # one readmission at a time (the step's threads may all wait for one)
        self.short_since: float | None = None
        self.served: Counter[str] = Counter()  # rollouts by the URL that served them, since the last take
        self.resent = 0
        self.stop = stop or threading.Event()  # the program's stop request: waits end (exit 143)
        self.turn = 0
        self.polls: list[Callable[[], object]] = []  # run by the monitor before each probe (joiners' discovery)
        self.live = live
        self.publish()

    def publish(self) -> None:
        """The live set into ``live`` (the trainer's broadcast reads it before every update)."""
        if self.live is None:
            return
        with self.lock:
            members = tuple(live_set.Member(m.url, "admitted" if m.admitted else
                                            "waiting" if m.state in ("restarting", "joining") else "dead", m.incarnation)
                            for m in self.members.values())
            live_set.write(self.live, live_set.LiveSet(attempt_from_env(), members, time.time()))

    # ---- who is admitted -------------------------------------------------------------------
    def admitted(self) -> list[str]:
        with self.lock:
            return [m.url for m in self.members.values() if m.admitted]

    def pick(self, key: int) -> Server:
        """Where request ``key`` goes: the router, else the admitted servers in turn (waits for one)."""
        if self.router is not None:
            return Server(self.router, timeout=600.0)
        return self.direct(key)

    def direct(self, key: int) -> Server:
        """An admitted server for request ``key`` (waits for one, up to the deadline)."""
        while True:
            live = self.admitted()
            if live:
                return Server(live[key % len(live)], timeout=600.0)
            self.wait_for_quorum(1)

    # ---- requests ----------------------------------------------------------------------------
    def send(self, key: int, fn: Callable[[Server], T], size: Callable[[T], int]) -> T:
        """``fn(server)`` on request ``key``'s server; a failure that may pass is sent again, whole, to a live
        server (its server probed, declared dead if it does not answer). ``size``: the rollouts an answer holds."""
        server, tries = self.pick(key), 0
        while True:
            try:
                out = self.call(server, fn)
            except VLLMError as e:
                tries += 1
                if not transient(e) or tries > 2 * len(self.members) + 2:
                    raise
                self.failed(server.base, str(e))
                with self.lock:
                    self.resent += 1
                server = self.direct(key + tries)
                continue
            with self.lock:
                self.served[server.base] += size(out)
            return out

    def call(self, server: Server, fn: Callable[[Server], T]) -> T:
        """``fn(server)``; a server declared dead while it runs (it stopped answering: hung, not gone) fails the
        request at once, as one that may pass, and the request is abandoned (its thread ends at its own deadline).
        Through the router, ``fn`` runs as it is: the router's workers are not ours to watch per request."""
        m = self.members.get(server.base)
        if m is None:
            return fn(server)
        gone, done = m.gone, threading.Event()
        out: list[T] = []
        err: list[BaseException] = []

        def run() -> None:
            try:
                out.append(fn(server))
            except BaseException as e:  # noqa: BLE001 - carried to the caller's thread
                err.append(e)
            finally:
                done.set()

        threading.Thread(target=run, daemon=True, name=f"request to {server.base}").start()
        while not done.wait(WAIT_POLL_S):
            if gone.is_set():
                why = ConnectionAbortedError("declared dead while the request was in flight")
                raise VLLMError(f"{server.base}: {why}", Answer(server.base, 0, error=why))
        if err:
            raise err[0]
        return out[0]

    def failed(self, url: str, why: str) -> None:
        """A request to ``url`` failed: probe it (every server when it is the router's) and declare the dead."""
        urls = self.admitted() if url == self.router else [url]
        for u in urls:
            cause = probe(u, self.probe_s)
            if cause:
                self.declare_dead(u, f"{cause} (after a failed request: {why[:200]})")

    # ---- deaths and returns --------------------------------------------------------------------
    def declare_dead(self, url: str, cause: str) -> None:
        with self.lock:
            m = self.members.get(url)
            if m is None or not m.admitted or self.stop.is_set():  # a planned stop takes the servers down too
                return
            m.state, m.cause, m.since, m.misses = "left" if m.job_id else "dead", cause, time.time(), 0
            m.gone.set()
            if m.job_id:  # a joined server does not come back: its job ended
                del self.members[url]
            if len(self.admitted()) < self.min_servers and self.short_since is None:
                self.short_since = time.time()
            self.publish()
        self.log(f"server {url} (task {m.task}) {'has left' if m.job_id else 'is dead'}: {cause}; "
                 f"{len(self.admitted())} live")
        self.record(m.state, m, cause)
        if self.router is not None:
            self.tell_router("remove_worker", url)

    def tell_router(self, route: str, url: str) -> None:
        answer = Server(self.router or "").ask("POST", f"/{route}?url={urllib.parse.quote(url, safe='')}",
                                               timeout=self.probe_s * 5)
        if not answer.ok:
            self.log(f"router {self.router}/{route} {url}: {answer.said() or answer.error}")

    def record(self, kind: str, m: Member, cause: str) -> None:
        if self.events is None:
            return
        attempt = attempt_from_env()
        append(self.events, Event(kind=kind, component="inference", task=m.task,
                                  node=urllib.parse.urlsplit(m.url).hostname, cause=cause,
                                  attempt=int(attempt) if attempt.isdigit() else None,
                                  job_id=m.job_id or os.environ.get("SLURM_JOB_ID")))

    def watch(self) -> None:
        """Probe every server once: an admitted one that misses ``MISSES`` probes in a row is dead, a dead one
        that answers is ``restarting`` (readmitted at the next ``readmit``)."""
        members = list(self.members.values())
        with ThreadPoolExecutor(max_workers=min(64, len(members))) as pool:
            causes = list(pool.map(lambda m: probe(m.url, self.probe_s), members))
        for m, cause in zip(members, causes):
            with self.lock:
                if m.admitted:
                    m.misses = m.misses + 1 if cause else 0
                    dead = m.misses >= MISSES
                else:
                    dead = False
                    if m.state == "dead" and not cause:
                        m.state, m.incarnation = "restarting", m.incarnation + 1
                        self.publish()
                        self.log(f"server {m.url} (task {m.task}) answers again: readmitted once it has the weights")
            if dead:
                self.declare_dead(m.url, f"{cause} ({MISSES} probes in a row)")

    def start_monitor(self) -> threading.Thread:
        def loop() -> None:
            while not self.stop.wait(self.probe_s):
                for poll in self.polls:
                    poll()
                self.watch()

        t = threading.Thread(target=loop, daemon=True, name="members")
        t.start()
        return t

    def readmit(self) -> list[str]:
        """Servers that came back, each loaded with the current weights (``admit``) and admitted; their URLs."""
        with self.admitting:
            return [m.url for m in self._returning() if self._readmit(m)]

    def _returning(self) -> list[Member]:
        with self.lock:
            return [m for m in self.members.values() if m.state in ("restarting", "joining")]

    def _readmit(self, m: Member) -> bool:
        """Load the current weights into ``m``, then admit it (True); back to dead when it does not take them,
        as it was when it does not have them yet (``admit`` False: a broadcast reaches it at the next update)."""
        try:
            if not self.admit(m.url):
                return False
        except VLLMError as e:
            self.log(f"server {m.url} (task {m.task}) came back but did not take the weights: {e}")
            with self.lock:
                m.state = "joining" if m.state == "joining" else "dead"  # asked again / probed again by the monitor
                self.publish()
            return False
        with self.lock:
            kind = "joined" if m.state == "joining" else "readmitted"
            m.state, m.since, m.cause, m.gone = kind, time.time(), "", threading.Event()
            if len(self.admitted()) >= self.min_servers:
                self.short_since = None
            self.publish()
        self.log(f"server {m.url} (task {m.task}) {kind}; {len(self.admitted())} live")
        self.record(kind, m, "")
        if self.router is not None:
            self.tell_router("add_worker", m.url)
        return True

    def join(self, url: str, task: int, job_id: str) -> bool:
        """A server of job ``job_id`` asks to join (True: new): admitted by the next ``readmit``."""
        with self.lock:
            if url in self.members:
                return False
            self.members[url] = Member(url, task, state="joining", since=time.time(), job_id=job_id)
            self.publish()
        self.log(f"server {url} (job {job_id}, task {task}) joins: admitted once it has the weights")
        return True

    def wait_for_quorum(self, need: int | None = None) -> None:
        """Until ``need`` (default ``min_servers``) servers are admitted, readmitting those that come back;
        ``Quorum`` once fewer than ``min_servers`` have been live for longer than ``grace_s``."""
        need = self.min_servers if need is None else need
        while len(self.admitted()) < need:
            with self.lock:
                since = self.short_since if self.short_since is not None else time.time()
                self.short_since = since
            if time.time() - since > self.grace_s:
                raise Quorum(self.reason())
            if self.stop.wait(WAIT_POLL_S):
                raise SystemExit(143)
            self.watch()
            self.readmit()

    def reason(self) -> str:
        """One line naming every server that is not live; each cause cut to CAUSE_CHARS, so that a long one (an
        engine's HTTP 500 body) never pushes the others out of the line the job's end keeps."""
        dead = [m for m in self.members.values() if not m.admitted]
        return (f"fewer than inference.min_servers = {self.min_servers} servers live for {self.grace_s:g}s: "
                + "; ".join(f"{m.url} (task {m.task}) {m.state}: {one_line(m.cause, CAUSE_CHARS)}" for m in dead))

    def take(self) -> tuple[dict[str, int | float | None], int, int]:
        """Rollouts served by URL, requests re-sent and servers live since the last call."""
        with self.lock:
            served: dict[str, int | float | None] = dict(self.served)
            resent = self.resent
            self.served, self.resent = Counter(), 0
            return served, resent, len(self.admitted())


def alone(urls: list[str], grace_s: float) -> Members:
    """A set over ``urls`` that records nothing (a sampler built without the orchestrator's set)."""
    return Members(urls, urls, min_servers=1, grace_s=grace_s, events=None, log=lambda _: None)
