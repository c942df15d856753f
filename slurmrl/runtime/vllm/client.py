"""The one client for vLLM's HTTP routes: the job's secret, timeouts and errors in one place.

Every program of the job that talks to a vLLM server (or to a front before several: vllm-router,
Dynamo's frontend) goes through here: the supervisor's ready checks, the orchestrator's sampling,
weight reloads, sleep mode and LoRA adapters, the judge client, the benchmark's endpoint check,
``python -m slurmrl.runtime.vllm.admin`` and the [collector]'s scrapes of ``GET /metrics``.

- ``ask(method, url, body)``: one request that never raises: an ``Answer`` with the HTTP status
  (0 when nothing answered: refused, reset, timed out, cut short) and the body or the reason.
- ``Server(base)``: vLLM's routes on one server; each raises ``VLLMError`` naming the URL and what
  the server said. Every request carries ``Authorization: Bearer <secret>`` when the job has one
  (``slurmrl.secret``; vLLM checks it with ``slurmrl.runtime.gates.job_auth``).
- ``each(urls, fn)``: ``fn(Server)`` on every server at once; one ``VLLMError`` naming each that failed.

The routes (vLLM's OpenAI server; the admin ones need ``VLLM_SERVER_DEV_MODE=1``, which the
planner sets where a job uses them): ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions``,
``POST /classify``, ``POST /pause?mode=wait``, ``POST /resume``, ``POST /collective_rpc``
(``reload_weights``), ``POST /reset_prefix_cache``, ``POST /sleep``, ``POST /wake_up``,
``GET /is_sleeping``, ``POST /v1/load_lora_adapter``, ``POST /v1/unload_lora_adapter``, the
weight-transfer routes (``POST /init_weight_transfer_engine``, ``/start_weight_update``,
``/update_weights``, ``/finish_weight_update``; ``WeightSync`` drives them on every server),
``GET /metrics`` (Prometheus text; any endpoint's, through ``ask``), and vllm-router's ``GET /list_workers``.
Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import base64
import http.client
import json
import pickle
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from slurmrl import secret

TIMEOUT_S = 300.0  # admin routes: pausing and reloading a large model takes minutes
SAID_CHARS = 300  # of an error answer, in a message
T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    url: str
    status: int  # 0: nothing answered
    body: bytes = b""
    error: BaseException | None = None  # why nothing answered

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    @property
    def reason(self) -> BaseException | None:
        """Why nothing answered: the socket's error behind urllib's wrapper."""
        reason = getattr(self.error, "reason", self.error)
        return reason if isinstance(reason, BaseException) else self.error

    @property
    def transient(self) -> bool:
        """A failure that may pass: no answer, HTTP 429 or 5xx."""
        return self.status == 0 or self.status == 429 or self.status >= 500

    def json(self):
        """The body as JSON (ValueError when it is not)."""
        return json.loads(self.body or b"null")

    def said(self, limit: int = SAID_CHARS) -> str:
        return self.body[:limit].decode(errors="replace")


class VLLMError(RuntimeError):
    """A server did not do what was asked; the message names its URL and what it said."""

    def __init__(self, message: str, answer: Answer | None = None):
        super().__init__(message)
        self.answer = answer


def failure(answer: Answer) -> VLLMError:
    if answer.status:
        return VLLMError(f"{answer.url}: HTTP {answer.status}: {answer.said()}", answer)
    return VLLMError(f"{answer.url}: {answer.error}", answer)


def ask(method: str, url: str, body: dict | None = None, timeout: float = TIMEOUT_S,
        headers: dict[str, str] | None = None) -> Answer:
    """One request with the job's secret (``headers`` adds to it); never raises."""
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **secret.headers(), **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Answer(url, r.status, r.read())
    except urllib.error.HTTPError as e:
        try:
            said = e.read()
        except (OSError, http.client.HTTPException):
            said = b""
        return Answer(url, e.code, said)
    except (OSError, ValueError, http.client.HTTPException) as e:  # refused, reset, timed out, cut short, bad URL
        return Answer(url, 0, error=e)


class Server:
    """vLLM's routes on one server at ``base`` (``http://HOST:PORT``)."""

    def __init__(self, base: str, timeout: float = TIMEOUT_S):
        self.base, self.timeout = base.rstrip("/"), timeout

    def ask(self, method: str, path: str, body: dict | None = None, timeout: float | None = None,
            headers: dict[str, str] | None = None) -> Answer:
        return ask(method, self.base + path, body, self.timeout if timeout is None else timeout, headers)

    def call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None,
             headers: dict[str, str] | None = None) -> bytes:
        """The body of a 2xx answer, else ``VLLMError``."""
        answer = self.ask(method, path, body, timeout, headers)
        if not answer.ok:
            raise failure(answer)
        return answer.body

    def call_json(self, method: str, path: str, body: dict | None = None, timeout: float | None = None,
                  headers: dict[str, str] | None = None):
        answer = self.ask(method, path, body, timeout, headers)
        if not answer.ok:
            raise failure(answer)
        try:
            return answer.json()
        except ValueError:
            raise VLLMError(f"{answer.url}: HTTP {answer.status} but not JSON: {answer.said()}", answer) from None

    # ---- serving -------------------------------------------------------------------------
    def health(self, timeout: float = 2.0) -> bool:
        return self.ask("GET", "/health", timeout=timeout).status == 200

    def models(self, timeout: float | None = None) -> list[str]:
        """The model names ``GET /v1/models`` lists."""
        listed = self.call_json("GET", "/v1/models", timeout=timeout)
        data = listed.get("data") if isinstance(listed, dict) else None
        return [m["id"] for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]

    def completions(self, body: dict, timeout: float | None = None, headers: dict[str, str] | None = None) -> dict:
        return self.call_json("POST", "/v1/completions", body, timeout, headers)

    def chat_completions(self, body: dict, timeout: float | None = None, headers: dict[str, str] | None = None) -> dict:
        """``POST /v1/chat/completions``: the model's chat template applies, tool calls come back parsed
        (servers run with ``--enable-auto-tool-choice --tool-call-parser NAME``). A body whose
        ``kv_transfer_params.prompt_token_ids`` holds token ids is served on exactly those ids (vLLM
        skips templating; the messages still tell the tool parser what was asked)."""
        return self.call_json("POST", "/v1/chat/completions", body, timeout, headers)

    def list_workers(self, timeout: float = 5.0) -> list[str] | None:
        """The worker URLs vllm-router lists (``{"urls": [...]}``), None when it does not answer so."""
        answer = self.ask("GET", "/list_workers", timeout=timeout)
        try:
            urls = answer.json().get("urls") if answer.status == 200 else None
        except (ValueError, AttributeError):
            return None
        return [u for u in urls if isinstance(u, str)] if isinstance(urls, list) else None

    # ---- weights (VLLM_SERVER_DEV_MODE=1) ------------------------------------------------
    def load_weights(self, weights_dir: str) -> None:
        """``reload_weights`` from a safetensors folder into the running engine (no pause)."""
        self.call("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": weights_dir}})

    def reload_weights(self, weights_dir: str) -> float:
        """Pause (running requests finish), load ``weights_dir``, drop the prefix cache, resume; seconds."""
        t = time.perf_counter()
        self.call("POST", "/pause?mode=wait")
        try:
            self.load_weights(weights_dir)
            self.call("POST", "/reset_prefix_cache")
        finally:
            self.call("POST", "/resume")
        return time.perf_counter() - t

    def pause(self) -> None:
        """Running requests finish, new ones wait until ``resume``."""
        self.call("POST", "/pause?mode=wait")

    def resume(self) -> None:
        self.call("POST", "/resume")

    def reset_prefix_cache(self) -> None:
        self.call("POST", "/reset_prefix_cache")

    # ---- weight transfer (--weight-transfer-config, VLLM_SERVER_DEV_MODE=1) ---------------
    def init_weight_transfer(self, init_info: dict) -> None:
        """Once: the server's workers join the trainer's transfer group (blocks until every rank has)."""
        self.call("POST", "/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self.call("POST", "/start_weight_update")

    def update_weights(self, update_info: dict | list) -> None:
        """Receive one update (blocks while the trainer sends it)."""
        self.call("POST", "/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.call("POST", "/finish_weight_update", {"weight_version": weight_version})

    # ---- sleep mode (--enable-sleep-mode) ------------------------------------------------
    def sleep(self, level: int) -> None:
        self.call("POST", f"/sleep?level={level}&mode=wait")

    def wake_up(self, tags: str) -> None:
        self.call("POST", f"/wake_up?tags={urllib.parse.quote(tags)}")

    def is_sleeping(self) -> bool:
        url = f"{self.base}/is_sleeping"
        try:
            return bool(self.call_json("GET", "/is_sleeping", timeout=60.0)["is_sleeping"])
        except (KeyError, TypeError):
            raise VLLMError(f"{url}: not a vLLM sleep-mode answer (is VLLM_SERVER_DEV_MODE=1 set?)") from None
        except VLLMError as e:
            if e.answer is not None and e.answer.ok:  # answered, but not JSON
                raise VLLMError(f"{url}: not a vLLM sleep-mode answer (is VLLM_SERVER_DEV_MODE=1 set?)") from None
            raise

    # ---- LoRA adapters (--enable-lora, VLLM_ALLOW_RUNTIME_LORA_UPDATING) ------------------
    def load_lora(self, name: str, path: str) -> None:
        self.call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload_lora(self, name: str) -> None:
        self.call("POST", "/v1/unload_lora_adapter", {"lora_name": name})


def each(urls: list[str], fn: Callable[[Server], T], timeout: float = TIMEOUT_S) -> dict[str, T]:
    """``fn`` on every server at once; what each returned by URL, or one ``VLLMError`` naming every
    server that failed."""
    with ThreadPoolExecutor(max_workers=max(1, min(64, len(urls)))) as pool:
        futures = {u: pool.submit(fn, Server(u, timeout)) for u in urls}
    errors, out = [], {}
    for u, f in futures.items():
        try:
            out[u] = f.result()
        except VLLMError as e:
            errors.append(str(e))
    if errors:
        raise VLLMError("; ".join(errors))
    return out


def http_safe(update_info: dict) -> dict:
    """vLLM's IPC engine puts CUDA IPC handles in ``ipc_handles``; over HTTP they travel pickled in
    ``ipc_handles_pickled`` (as vLLM's own HTTP client sends them; the server needs
    ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, which the planner sets for ``ipc``)."""
    if update_info.get("ipc_handles") is None:
        return update_info
    out = {k: v for k, v in update_info.items() if k != "ipc_handles"}
    out["ipc_handles_pickled"] = base64.b64encode(pickle.dumps(update_info["ipc_handles"])).decode()
    return out


class WeightSync:
    """vLLM's weight-sync control plane (its ``VLLMWeightSyncClient`` protocol: the four methods
    below) over every server of a job at once, for a trainer-side weight-transfer engine.

    ``ranks``: the worker processes of each server (tp x dp of its role), in the order of ``urls``;
    server i's workers join the transfer group at ``rank_offset = 1 + ranks[0] + ... + ranks[i-1]``
    (the trainer is rank 0), so every TP/DP rank of every replica (and of both P/D roles) has its own
    rank. Each phase runs on every server at once; one ``VLLMError`` names each server that failed."""

    def __init__(self, urls: list[str], ranks: list[int], timeout: float = TIMEOUT_S):
        if len(urls) != len(ranks):
            raise ValueError(f"{len(urls)} servers but {len(ranks)} rank counts")
        self.urls, self.ranks, self.timeout = list(urls), list(ranks), timeout
        self.offsets = {u: 1 + sum(ranks[:i]) for i, u in enumerate(urls)}

    @property
    def world_size(self) -> int:
        return 1 + sum(self.ranks)

    def _each(self, fn: Callable[[Server], object]) -> None:
        each(self.urls, fn, self.timeout)

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        """A group's init info (it has a ``world_size``) gets each server's ``rank_offset``; IPC's has none."""
        if "world_size" not in init_info:
            self._each(lambda s: s.init_weight_transfer(init_info))
        else:
            self._each(lambda s: s.init_weight_transfer({**init_info, "rank_offset": self.offsets[s.base]}))

    def start_weight_update(self) -> None:
        self._each(lambda s: s.start_weight_update())

    def update_weights(self, update_info: dict | list) -> None:
        info = [http_safe(i) for i in update_info] if isinstance(update_info, list) else http_safe(update_info)
        self._each(lambda s: s.update_weights(info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._each(lambda s: s.finish_weight_update(weight_version))

    def pause(self) -> None:
        self._each(lambda s: s.pause())

    def resume(self) -> None:
        """Drop the prefix cache (its KV came from the old weights), then take requests again."""
        def fresh(s: Server) -> None:
            s.reset_prefix_cache()
            s.resume()

        self._each(fresh)

    def dead(self) -> list[str]:
        """The servers whose /health does not answer 200 now."""
        return [u for u in self.urls if not Server(u).health(timeout=5.0)]


def timed(fn: Callable[[Server], object]) -> Callable[[Server], float]:
    def run(server: Server) -> float:
        t = time.perf_counter()
        fn(server)
        return time.perf_counter() - t
    return run


def reload_weights(urls: list[str], weights_dir: str) -> dict[str, float]:
    """Every server reloads ``weights_dir`` (pause, load, reset cache, resume); seconds per server."""
    return each(urls, lambda s: s.reload_weights(weights_dir))


def load_lora(urls: list[str], name: str, path: str) -> dict[str, float]:
    """Every server loads the adapter at ``path`` as ``name``; seconds per server."""
    return each(urls, timed(lambda s: s.load_lora(name, path)))


def unload_lora(urls: list[str], name: str) -> dict[str, float]:
    return each(urls, timed(lambda s: s.unload_lora(name)))
