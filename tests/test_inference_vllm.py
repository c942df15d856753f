"""Real vLLM (CPU build) servers and the real vllm-router, run through slurmrl's runtimes on loopback."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import pytest
from live_components import (
    TEST_SECRET,
    LiveComponent,
    free_port_base,
    post_json,
    serve_recipe,
    transformers_logprobs,
    vllm_plugin_on_path,
)

from slurmrl.app import report_data as rd
from slurmrl.contract.weight_sync import Broadcast
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.scrape import read_scrapes
from slurmrl.runtime.collector.loop import Collector
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny
from slurmrl.runtime.vllm import client

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return build_tiny(root / "seed0", seed=0), build_tiny(root / "seed1", seed=1)


def _render(tmp, model, policy):
    from slurmrl.app.build import render

    recipe = tmp / f"{policy}.toml"
    recipe.write_text(serve_recipe(model, policy=policy, weight_transfer="gloo"))  # slurmrl's vLLM plugin
    return render(recipe, run_dir=tmp / f"run-{policy}")


class Servers:
    def __init__(self, tmp, model):
        self.tmp, self.model = tmp, model
        vllm_plugin_on_path(tmp / "plugin")
        self.out = _render(tmp, model, "consistent_hash")
        self.base = free_port_base()
        self.procs = [LiveComponent(self.out.run_dir, "inference", self.base, local=i, tasks=2) for i in range(2)]
        self.urls = [f"http://127.0.0.1:{self.base + 16 + i}" for i in range(2)]
        for proc, url in zip(self.procs, self.urls):
            proc.wait_http(f"{url}/health", timeout=600)
            proc.wait_ready(timeout=120)  # /health answers before the supervisor writes the ready file

    def request_counts(self) -> list[float]:
        counts = []
        for url in self.urls:
            text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
            counts.append(sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)", text, re.M)))
        return counts

    def router(self, policy: str) -> LiveComponent:
        out = self.out if policy == "consistent_hash" else _render(self.tmp, self.model, policy)
        # the batch shell exports the servers' URLs (from their ready files) before it starts the router
        proc = LiveComponent(out.run_dir, "router", self.base, extra_env={"URLS_INFERENCE": " ".join(self.urls)})
        proc.wait_http(f"http://127.0.0.1:{self.base}/health", timeout=120)
        proc.wait_ready(timeout=120)  # its completion check has gone through: counts start after it
        return proc


@pytest.fixture(scope="module")
def servers(models, tmp_path_factory):
    s = Servers(tmp_path_factory.mktemp("serve"), models[0])
    yield s
    for p in s.procs:
        p.stop()


def complete(url: str, prompt: str, headers: dict | None = None, **kw) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True, **kw}
    return post_json(f"{url}/v1/completions", body, headers)


def test_one_replica_answers_completions_and_chat_through_openai(servers):
    import openai

    client = openai.OpenAI(base_url=f"{servers.urls[0]}/v1", api_key=TEST_SECRET)  # the job's secret
    c = client.completions.create(model="tiny", prompt="hello", max_tokens=6, extra_body={"ignore_eos": True})
    assert c.usage.completion_tokens == 6 and isinstance(c.choices[0].text, str)
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert chat.usage.completion_tokens == 5 and chat.choices[0].message.role == "assistant"


@pytest.mark.parametrize("method, path", [("POST", "/v1/completions"), ("GET", "/v1/models"), ("POST", "/pause"),
                                          ("POST", "/collective_rpc"), ("POST", "/reset_prefix_cache")])
def test_requests_and_admin_calls_need_the_job_secret(servers, method, path):
    def call(headers):
        body = json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 1}).encode() if path == "/v1/completions" else b""
        req = urllib.request.Request(f"{servers.urls[0]}{path}", data=body if method == "POST" else None,
                                     method=method, headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    assert call({}) == 401
    assert call({"Authorization": "Bearer wrong"}) == 401
    if path in ("/v1/completions", "/v1/models"):  # the admin calls are exercised with the secret by the reload test
        assert call({"Authorization": f"Bearer {TEST_SECRET}"}) == 200
    assert urllib.request.urlopen(f"{servers.urls[0]}/health", timeout=10).status == 200  # readiness stays open


def test_servers_wrote_ready_files(servers):
    ready = servers.out.run_dir / "ready" / "attempt-0"
    assert sorted(p.name for p in ready.iterdir()) == ["inference.0", "inference.1"]


def test_the_collector_keeps_what_changed_on_real_servers(servers, tmp_path):
    """The [collector] over the servers' ready files: vLLM's /metrics (open without the secret, sent
    anyway) read back as counters that grew with a request, and TTFT buckets."""
    run = RunDir(servers.out.run_dir)
    c = Collector(run, "0", ["inference"], {}, max_bytes=1 << 30, timeout=10,
                  headers={"Authorization": f"Bearer {TEST_SECRET}"}, gpu=False)
    c.tick(1.0)
    complete(servers.urls[0], "count the tokens", headers={"Authorization": f"Bearer {TEST_SECRET}"})
    c.tick(2.0)
    s = read_scrapes(run.scrape_file(0, "inference.0"))
    done = rd.summed(s, ("vllm:request_success_total",))
    assert [t for t, _ in done] == [1.0, 2.0] and done[1][1] == done[0][1] + 1
    assert rd.hist_quantiles(s, rd.TTFT) and len(s.values) > 100  # every series kept, each name written once
    first, second = (len(x) for x in run.scrape_file(0, "inference.0").read_text().splitlines()[1:3])
    assert second < first / 4  # the second scrape holds only what changed


def test_consistent_hash_keeps_a_session_on_one_replica(servers):
    router = servers.router("consistent_hash")
    try:
        url = f"http://127.0.0.1:{servers.base}"
        before = servers.request_counts()
        for _ in range(6):
            complete(url, "same session", {"X-Session-ID": "session-a"})
        mid = servers.request_counts()
        delta = [m - b for m, b in zip(mid, before)]
        assert sorted(delta) == [0, 6], f"one session spread over replicas: {delta}"
        for i in range(16):
            complete(url, "many sessions", {"X-Session-ID": f"session-{i}"})
        spread = [a - m for a, m in zip(servers.request_counts(), mid)]
        assert sum(spread) == 16 and min(spread) > 0, f"16 sessions all went to one replica: {spread}"
    finally:
        router.stop()


def test_round_robin_spreads_requests(servers):
    router = servers.router("round_robin")
    try:
        before = servers.request_counts()
        for _ in range(8):
            complete(f"http://127.0.0.1:{servers.base}", "round robin", {"X-Session-ID": "fixed"})
        delta = [a - b for a, b in zip(servers.request_counts(), before)]
        assert sum(delta) == 8 and abs(delta[0] - delta[1]) <= 1, delta
    finally:
        router.stop()


def _server_logprobs(url):
    out = complete(url, "reload check", max_tokens=8, logprobs=0, return_tokens_as_token_ids=True)
    lp = out["choices"][0]["logprobs"]
    return [int(t.split(":")[1]) for t in lp["tokens"]], lp["token_logprobs"]


def test_weight_reload_matches_the_new_checkpoint(servers, models):
    from transformers import AutoTokenizer

    url = servers.urls[0]
    prompt_ids = AutoTokenizer.from_pretrained(models[0])("reload check")["input_ids"]
    t = time.perf_counter()
    took = client.reload_weights([url], str(models[1]))
    assert time.perf_counter() - t < 120 and url in took
    try:
        ids, served = _server_logprobs(url)
        expected = transformers_logprobs(models[1], prompt_ids, ids)
        assert served == pytest.approx(expected, abs=2e-3)
        old = transformers_logprobs(models[0], prompt_ids, ids)
        assert max(abs(a - b) for a, b in zip(served, old)) > 0.05, "server still answers with the old weights"
    finally:
        client.reload_weights([url], str(models[0]))
    ids, served = _server_logprobs(url)
    assert served == pytest.approx(transformers_logprobs(models[0], prompt_ids, ids), abs=2e-3)


def test_broadcast_through_vllms_weight_transfer_routes_changes_the_served_logprobs(servers, models, tmp_path):
    """The trainer's side of vLLM's four-phase protocol over slurmrl's gloo engine (the vLLM plugin),
    to both servers at once (one group of 3: the trainer, then each server's worker at its offset):
    the served logprobs become the new model's, then the old model's again."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slurmrl.runtime.trainer.weight_sync import Broadcaster, SyncFailed, Target

    prompt_ids = AutoTokenizer.from_pretrained(models[0])("reload check")["input_ids"]
    new = AutoModelForCausalLM.from_pretrained(models[1], dtype=torch.float32)
    port = free_port_base() + 7  # the port table's weight_broadcast
    target = Target(Broadcast("gloo", 120), servers.urls, [1, 1], "127.0.0.1", port, world_size=3)
    sender = Broadcaster(target, new, rank=0, dtype=torch.float32)  # float32: the servers serve float32
    sender.sync(1)
    for url in servers.urls:
        ids, served = _server_logprobs(url)
        assert served == pytest.approx(transformers_logprobs(models[1], prompt_ids, ids), abs=2e-3), url
        old = transformers_logprobs(models[0], prompt_ids, ids)
        assert max(abs(a - b) for a, b in zip(served, old)) > 0.05, f"{url} still answers with the old weights"
    with torch.no_grad():  # a changed weight changes what is served after the next sync
        new.load_state_dict(AutoModelForCausalLM.from_pretrained(models[0], dtype=torch.float32).state_dict())
    sender.sync(2)
    ids, served = _server_logprobs(servers.urls[0])
    assert served == pytest.approx(transformers_logprobs(models[0], prompt_ids, ids), abs=2e-3)
    with pytest.raises(SyncFailed, match="plan says 4"):  # a group the plan does not describe is refused
        Target(Broadcast("gloo", 600), servers.urls, [1, 1], "127.0.0.1", port, world_size=4).check()


def test_a_trace_replays_at_its_own_times_with_goodput_through_vllms_load_generator(servers, models, tmp_path,
                                                                                  monkeypatch):
    """[benchmark] trace replay against a real server: vLLM's timed_trace dataset sends each request of
    a small Mooncake-style trace (shared hash ids: shared prompt blocks) at its timestamp, and the
    summary has goodput under the targets (generous ones: every request is good)."""
    import json

    from slurmrl.rundir.benchmark import read_summary
    from slurmrl.runtime.bench import runner as bench

    secret_file = tmp_path / "secret"
    secret_file.write_text(TEST_SECRET + "\n")
    monkeypatch.setenv("SLURMRL_SECRET_FILE", str(secret_file))
    monkeypatch.delenv("SLURMRL_RUN_DIR", raising=False)
    trace = tmp_path / "trace.jsonl"
    stamps = [0, 300, 600, 900, 1200, 1500]  # ms
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": 40, "output_length": 4,
                                         "hash_ids": [1, 2 + k % 2, 10 + k]}) + "\n" for k, t in enumerate(stamps)))
    argv = ["--out", str(tmp_path / "benchmark"), "--timeout", "300", "--",
            "--base-url", servers.urls[0], "--dataset-name", "timed_trace", "--dataset-path", str(trace),
            "--timed-trace-chunk-hash-size", "16", "--timed-trace-sec-multiplier", "0.001",
            "--model", str(models[0]), "--served-model-name", "tiny", "--goodput", "ttft:600000", "e2el:600000",
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--disable-tqdm"]
    assert bench.run(*bench.parse(argv)) == 0
    summary = read_summary(tmp_path)
    assert summary is not None and summary.status == "done" and summary.num_prompts == len(stamps)
    (p,) = summary.points
    assert p["file"] == "trace.json" and p["completed"] == len(stamps) and p["failed"] == 0, p
    assert p["duration_s"] >= 1.5, p  # the last request went out at its timestamp, 1.5 s in
    assert p["request_goodput"] == pytest.approx(p["request_throughput"]) and p["good_share"] == pytest.approx(1.0)
    point = json.loads((tmp_path / "benchmark" / "trace.json").read_text())
    assert point["total_input_tokens"] == 40 * len(stamps) and point["total_output_tokens"] == 4 * len(stamps)


def test_multi_turn_sessions_replay_through_aiperf_with_the_history_after_each_answer(servers, models, tmp_path,
                                                                                   monkeypatch):
    """[benchmark] trace_format = "multi_turn" against a real server: aiperf (.venv-aiperf) replays 3
    sessions x 3 turns, all sessions at once, with the job's secret; within a session each turn goes out
    its delay after the previous answer arrived and carries the conversation so far (the server counts a
    longer prompt than the previous turn's prompt plus its answer); the summary has the trace's figures
    and goodput (tests/test_benchmark_multiturn.py's check_replay)."""
    from session_replay import check_replay, replay_argv, write_sessions

    from slurmrl.runtime.bench import runner as bench

    secret_file = tmp_path / "secret"
    secret_file.write_text(TEST_SECRET + "\n")
    monkeypatch.setenv("SLURMRL_SECRET_FILE", str(secret_file))
    monkeypatch.delenv("SLURMRL_RUN_DIR", raising=False)
    # short turns: the tiny model's context is 256 tokens and the third turn carries the first two
    trace = write_sessions(tmp_path / "sessions.jsonl", sessions=3, turns=3, delay_ms=400, words="rain ")
    argv = replay_argv(tmp_path / "benchmark", servers.urls[0], str(models[0]), trace,
                       "time_to_first_token:600000 request_latency:600000")
    assert bench.run(*bench.parse(argv)) == 0, (tmp_path / "benchmark" / "summary.json").read_text()
    check_replay(tmp_path, sessions=3, turns=3, delay_ms=400)
