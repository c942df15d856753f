"""The judge client (slurmrl.runtime.orchestrator.judge_client) against a real HTTP server on loopback.

``FakeJudge`` is a test double of vLLM's two scoring routes (``/v1/completions`` for a generative
judge, ``/classify`` for a reward model): a real ThreadingHTTPServer whose replies the test scripts
(delays, HTTP errors), so batching, timeouts, retries and a judge that is down can be seen
without a model. tests/test_judge_cluster.py scores through real vLLM servers.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from json_reply import send_json

from slurmrl.envs.judge import Judge
from slurmrl.runtime.orchestrator.judge_client import JudgeClient, JudgeError, attach, parse_score
from slurmrl.settings.judge import JudgeSettings

GEN = dict(kind="generative", template="Q: {prompt} A: {completion}", served_model_name="judge")


class FakeJudge:
    """A loopback HTTP server answering like vLLM's judge routes (test double); ``script`` is a list of
    actions for the next requests: ("ok", delay_s) or ("http", code)."""

    def __init__(self, reply=None, port: int = 0):
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.script: list[tuple] = []
        self.reply = reply
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802 - /health
                send_json(self, 200, {})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append({"path": self.path, **body})
                    outer.headers.append(dict(self.headers))
                    action = outer.script.pop(0) if outer.script else ("ok", 0)
                if action[0] == "http":
                    self.send_response(action[1])
                    self.end_headers()
                    self.wfile.write(b'{"error": "scripted"}')
                    return
                time.sleep(action[1])
                try:
                    send_json(self, 200, outer.answer(self.path, body))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def answer(self, path: str, body: dict) -> dict:
        if self.reply is not None:
            return self.reply(path, body)
        if path == "/v1/completions":  # the score is the prompt's length, backwards (index order must be kept)
            choices = [{"index": i, "text": f" {len(p) % 11} points"} for i, p in enumerate(body["prompt"])]
            return {"choices": choices[::-1]}
        data = [{"index": i, "probs": [len(t) / 10], "num_classes": 1} for i, t in enumerate(body["input"])]
        return {"data": data[::-1]}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def judge():
    j = FakeJudge()
    yield j
    j.close()


def settings(**kw) -> JudgeSettings:
    return JudgeSettings(**{**GEN, **kw})


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connection refused
    return f"http://127.0.0.1:{port}"


def test_batches_of_batch_size_scores_in_order_and_latency(judge):
    c = JudgeClient([judge.url], settings(batch_size=4, max_score=10), headers={"Authorization": "Bearer s3"})
    items = [{"prompt": "p" * i, "completion": "c"} for i in range(10)]
    got = c.score(items)
    texts = [f"Q: {'p' * i} A: c" for i in range(10)]
    assert got == [min(len(t) % 11, 10) / 10 for t in texts]
    sizes = sorted(len(r["prompt"]) for r in judge.requests)
    assert sizes == [2, 4, 4]
    assert all(r["path"] == "/v1/completions" and r["temperature"] == 0.0 and r["model"] == "judge"
               and r["max_tokens"] == 16 for r in judge.requests)
    assert sorted(t for r in judge.requests for t in r["prompt"]) == sorted(texts)
    assert all(h["Authorization"] == "Bearer s3" for h in judge.headers)
    stats = c.take_stats()
    assert stats.requests == 3 and stats.scored == 10 and stats.retries == 0
    assert 0 < stats.latency_mean_s <= stats.latency_max_s
    assert c.take_stats().requests == 0  # figures are per step


def test_reward_model_reads_classify_scores(judge):
    c = JudgeClient([judge.url], settings(kind="reward_model", template="{prompt}{completion}", batch_size=3))
    got = c.score([{"prompt": "ab", "completion": "c" * i} for i in range(5)])
    assert got == pytest.approx([(2 + i) / 10 for i in range(5)])
    assert {r["path"] for r in judge.requests} == {"/classify"}
    assert all(r["use_activation"] is False for r in judge.requests)


def test_reward_model_with_several_classes_is_refused():
    j = FakeJudge(reply=lambda path, body: {"data": [{"index": 0, "probs": [0.2, 0.8], "num_classes": 2}]})
    try:
        c = JudgeClient([j.url], settings(kind="reward_model", template="{completion}"))
        with pytest.raises(JudgeError, match=r"returns \[2\] classes"):
            c.score_texts(["x"])
    finally:
        j.close()


def test_replies_without_a_number_score_zero_and_are_counted():
    j = FakeJudge(reply=lambda path, body: {"choices": [{"index": 0, "text": "great answer"},
                                                        {"index": 1, "text": "15/10"}]})
    try:
        c = JudgeClient([j.url], settings(max_score=10))
        assert c.score_texts(["a", "b"]) == [0.0, 1.0]  # 15 clamps to the top of the scale
        assert c.take_stats().unparsed == 1
    finally:
        j.close()


def test_a_timeout_is_retried_on_the_next_server(judge):
    other = FakeJudge()
    try:
        judge.script = [("ok", 2.5)]  # longer than the 1 s timeout
        c = JudgeClient([judge.url, other.url], settings(timeout=1, retries=2), backoff_s=0.01)
        assert c.score_texts(["Q: 1 A: 2"]) == [9 / 10]
        assert len(other.requests) == 1  # the retry went to the next server
        assert c.take_stats().retries == 1
    finally:
        other.close()


def test_http_503_and_429_are_retried_and_400_is_not(judge):
    judge.script = [("http", 503), ("http", 429)]
    c = JudgeClient([judge.url], settings(retries=2), backoff_s=0.01)
    assert len(c.score_texts(["x"])) == 1
    assert len(judge.requests) == 3
    judge.script = [("http", 400)]
    with pytest.raises(JudgeError, match=r"refused /v1/completions: HTTP 400"):
        c.score_texts(["x"])
    assert len(judge.requests) == 4  # no retry: a bad request stays bad


def test_a_judge_that_is_down_fails_naming_it():
    url = closed_port_url()
    c = JudgeClient([url], settings(retries=2), backoff_s=0.01)
    t = time.perf_counter()
    with pytest.raises(JudgeError) as e:
        c.score_texts(["x", "y"])
    assert url in str(e.value) and "after 3 tries" in str(e.value) and "ConnectionRefusedError" in str(e.value)
    assert time.perf_counter() - t < 10


def test_a_judge_that_goes_away_is_waited_for_and_its_scores_resume(judge):
    port = judge.server.server_address[1]
    judge.close()  # the judge's server died; its supervisor brings it back on the same port
    back: list[FakeJudge] = []
    threading.Timer(1.5, lambda: back.append(FakeJudge(port=port))).start()
    c = JudgeClient([judge.url], settings(retries=1, wait_s=30), backoff_s=0.01)
    try:
        assert c.score_texts(["x" * 3, "y" * 5]) == [0.3, 0.5]  # " 3 points", " 5 points" out of 10
        assert len(back[0].requests) == 1 and c.take_stats().retries == 1
    finally:
        for j in back:
            j.close()
    gone = closed_port_url()
    with pytest.raises(JudgeError) as e:  # not back within the deadline: the judge is named, as before
        JudgeClient([gone], settings(retries=0, wait_s=1), backoff_s=0.01).score_texts(["x"])
    assert gone in str(e.value)


def test_template_fields_come_from_the_task():
    c = JudgeClient(["http://127.0.0.1:9"], settings(template="{prompt} -> {completion} (want {reference})"))
    assert c.render({"prompt": "p", "completion": "c", "reference": "r"}) == "p -> c (want r)"
    with pytest.raises(JudgeError, match=r"placeholder \{reference\} is not a field of the task; it has "
                                         r"\{completion\}, \{prompt\}"):
        c.render({"prompt": "p", "completion": "c"})


def test_parse_score():
    assert parse_score(" 7", 10) == 0.7
    assert parse_score("Rating: -3", 10) == 0.0
    assert parse_score("8.5/10", 10) == 0.85
    assert parse_score("none", 10) is None


def test_judge_environment_scores_a_dataset_through_the_client(judge, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "2+2=", "reference": "4"}\n\n{"prompt": "3+3=", "reference": "6"}\n')
    env = Judge(dataset=str(data))
    attach(env, [judge.url], settings(template="{prompt}{completion} ({reference})"), {})
    tasks = env.prompts(random.Random(0), 4)
    assert {t["prompt"] for t in tasks} <= {"2+2=", "3+3="}
    got = env.rewards(tasks, ["4"] * 4)
    assert got == [len(f"{t['prompt']}4 ({t['reference']})") % 11 / 10 for t in tasks]
    assert sorted(p for r in judge.requests for p in r["prompt"]) == sorted(
        f"{t['prompt']}4 ({t['reference']})" for t in tasks)


def test_attach_refuses_an_environment_without_use_judge(judge):
    class Plain:
        kind = "text"

        def prompts(self, rng, n):
            return []

        def reward(self, task, completion):
            return 0.0

    with pytest.raises(JudgeError, match="no use_judge"):
        attach(Plain(), [judge.url], settings(), {})
    assert attach(Plain(), [], None, {}) is None


def test_judge_environment_arguments():
    with pytest.raises(ValueError, match="one place"):
        Judge()
    with pytest.raises(ValueError, match="not a built-in"):
        Judge(prompts_from="chess")
    assert Judge(prompts_from="arithmetic").prompts(random.Random(0), 2)[0]["target"]
