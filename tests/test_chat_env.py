"""Chat environments without a server: the built-in guess_number, the protocol checks, the template's
tokens between turns, environment steps under a time limit, a tool's subprocess, and the trainer's
loss mask over the environment's tokens."""

from __future__ import annotations

import math
import random
import threading

import pytest

from slurmrl import envs
from slurmrl.envs.chat import tool_replies
from slurmrl.envs.protocol import CHAT_ONLY, HOOKS, ChatEnvironment, Environment, TextEnvironment, refuse_chat_only
from slurmrl.envs.tools import ToolTimeout, run_python
from slurmrl.runtime.fixtures.tiny_model import build_tokenizer
from slurmrl.runtime.orchestrator.chat_tokens import ChatTokens, TemplateError
from slurmrl.runtime.orchestrator.rollout_chat import StepTimeout, within


def said(*contents: str) -> list[dict]:
    return [{"role": "assistant" if k % 2 == 0 else "user", "content": c} for k, c in enumerate(contents)]


def test_guess_number_answers_higher_or_lower_and_ends_on_the_number():
    env = envs.load("guess_number", {"low": 1, "high": 10})
    [task] = env.prompts(random.Random(0), 1)
    secret = task["secret"]
    assert env.chat and task["messages"][-1]["role"] == "user"
    below, above = (secret - 1, secret + 1)
    if below >= 1:
        assert env.respond(task, said(f"{below}")) == [{"role": "user", "content": "Higher."}]
    if above <= 10:
        assert env.respond(task, said(f"I say {above}!")) == [{"role": "user", "content": "Lower."}]
    assert env.respond(task, said("no idea")) == [{"role": "user", "content": "Answer with a number from 1 to 10."}]
    assert env.respond(task, said(str(secret))) == []
    assert env.reward(task, said("x", "Answer...", str(secret))) == 1.0
    assert env.reward(task, said("none", "Answer...", "99")) == 0.0
    far = 1 if secret > 5 else 10
    near = secret - 1 if secret > 5 else secret + 1
    assert 0 < env.reward(task, said(str(far))) < env.reward(task, said(str(far), "..", str(near))) < 0.5
    with pytest.raises(SystemExit, match="high > low"):
        envs.load("guess_number", {"low": 3, "high": 3})


class NoReward:
    kind = "text"

    def prompts(self, rng, n):
        return []


def test_a_broken_environment_class_fails_at_load_named(monkeypatch):
    monkeypatch.setitem(envs.BUILTIN, "no_reward", NoReward)
    with pytest.raises(SystemExit, match=r"^slurmrl: orchestrator.environment: environment 'no_reward' \(NoReward\) "
                       r"has no reward\(task, completion\)$"):
        envs.load("no_reward")


class Game:
    """A chat environment by its methods; ``kind`` is set per test."""

    def prompts(self, rng, n):
        return [{"messages": [{"role": "user", "content": "go"}]} for _ in range(n)]

    def respond(self, task, messages):
        return []

    def reward(self, task, messages):
        return 1.0


@pytest.mark.parametrize("kind, says", [
    (None, 'declares no kind: give its class kind = "text" (prompt text) or kind = "chat" (messages)'),
    ("multi", "declares kind = 'multi'; an environment's kind is \"text\" or \"chat\""),
    ("text", "declares kind = 'text' but has respond, which only a chat environment's conversations call"),
])
def test_an_environment_without_a_kind_or_with_another_kinds_hooks_fails_at_load(monkeypatch, kind, says):
    cls = type("Game", (Game,), {} if kind is None else {"kind": kind})
    monkeypatch.setitem(envs.BUILTIN, "game", cls)
    with pytest.raises(SystemExit) as e:
        envs.load("game", field="eval.environment")
    assert str(e.value.code) == f"slurmrl: eval.environment: environment 'game' (Game) {says}"
    assert Environment(type("Game", (Game,), {"kind": "chat"})()).chat


def test_tasks_of_the_other_kinds_shape_are_refused_when_drawn(monkeypatch):
    class Says:
        kind = "text"

        def prompts(self, rng, n):
            return [{"messages": []}] * n

        def reward(self, task, completion):
            return 0.0

    with pytest.raises(SystemExit, match=r"environment 'Says' \(Says\) declares kind = 'text' but gave a task "
                       r"without 'prompt'"):
        Environment(Says()).prompts(random.Random(0), 2)


def test_every_built_in_environment_declares_its_kind_and_meets_its_protocol():
    for name, cls in envs.BUILTIN.items():
        env = envs.load(name, {"prompts_from": "arithmetic"} if name == "judge" else {})
        protocol = ChatEnvironment if env.chat else TextEnvironment
        assert isinstance(env.obj, protocol) and cls.kind == env.kind == envs.kind(name), name
        assert all(key in t for t in env.prompts(random.Random(0), 3) for key in [("messages" if env.chat else "prompt")])
    assert envs.kind("verifiers:any") == "chat" and envs.kind("my.pkg:Env") is None
    assert set(HOOKS) == {"rewards", "use_judge", "preflight", "split_key", "begin", "respond", "call_tool", "tools",
                          "use_servers"}


def test_the_hooks_defaults_stand_in_for_what_an_environment_lacks():
    env = envs.load("guess_number")  # respond and reward only
    [task] = env.prompts(random.Random(0), 1)
    assert env.begin(task) is task and env.tools is None and not env.answers_tools and not env.has("rewards")
    env.use_servers(["http://x"], "m", None)  # nothing to tell
    assert env.rewards([task], [[{"role": "assistant", "content": str(task["secret"])}]]) == [1.0]
    one_turn = type("OneTurn", (), {"kind": "chat", "prompts": Game.prompts, "reward": Game.reward})()
    assert Environment(one_turn).respond(task, []) == []  # no respond: the conversation ends after one turn


def test_a_chat_only_setting_is_refused_once_every_environment_is_known_to_be_text():
    text, chat = envs.load("arithmetic"), envs.load("guess_number")
    assert "orchestrator.max_turns" in CHAT_ONLY
    with pytest.raises(SystemExit) as e:
        refuse_chat_only({"orchestrator.environment": text}, ["orchestrator.max_turns"])
    assert str(e.value.code) == ("slurmrl: orchestrator.max_turns: only applies to a chat environment's conversations; "
                                 "orchestrator.environment 'arithmetic' is a text environment (one completion per "
                                 "prompt): remove the setting")
    refuse_chat_only({"orchestrator.environment": text, "eval.environment": chat}, ["orchestrator.max_turns"])
    refuse_chat_only({"orchestrator.environment": text}, [])  # defaults: nothing set


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    return ChatTokens(build_tokenizer(tmp_path_factory.mktemp("tok")))


def test_the_tokens_between_turns_are_the_templates_around_the_replies(tokens):
    convo = [{"role": "user", "content": "guess"}, {"role": "assistant", "content": "5"}]
    replies = [{"role": "user", "content": "Higher."}]
    decode = tokens.tok.decode
    # the model stopped on the end-of-turn token itself: only what follows it is the environment's
    assert decode(tokens.between(convo, replies, None, "<|end|>")) == "<|user|>Higher.<|end|><|assistant|>"
    # cut at its token limit: the template's end of the turn is the environment's too
    assert decode(tokens.between(convo, replies, None, "")) == "<|end|><|user|>Higher.<|end|><|assistant|>"


def test_a_template_that_rewrites_earlier_turns_is_refused(tokens):
    class Rewrites:
        def apply_chat_template(self, messages, **kw):  # TEST DOUBLE: a template that shows the last turn only
            return messages[-1]["content"] + ("<a>" if kw.get("add_generation_prompt") else "")

    with pytest.raises(TemplateError, match="renders the earlier turns differently"):
        ChatTokens(Rewrites()).between([{"role": "assistant", "content": "5"}], [{"role": "user", "content": "no"}],
                                       None, "")


def test_environment_steps_run_under_a_time_limit():
    assert within(5, lambda x: x + 1, 1) == 2
    with pytest.raises(ValueError, match="bad"):
        within(5, lambda: (_ for _ in ()).throw(ValueError("bad")))
    hang = threading.Event()
    with pytest.raises(StepTimeout, match="longer than 0.2 s"):
        within(0.2, hang.wait)
    hang.set()


def test_a_tool_runs_user_code_in_a_subprocess_with_a_limit():
    assert run_python("print(6 * 7)") == "42"
    assert "ZeroDivisionError" in run_python("1 / 0")
    with pytest.raises(ToolTimeout, match="1 s limit"):
        run_python("while True: pass", timeout_s=1)


def test_tool_calls_are_answered_through_call_tool():
    class Calc(Game):
        kind = "chat"

        def call_tool(self, name, arguments):
            return arguments["a"] + arguments["b"] if name == "add" else "no such tool"

    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "c2", "type": "function", "function": {"name": "add", "arguments": "{not json"}}]}
    out = tool_replies(Calc(), msg)
    assert out[0] == {"role": "tool", "tool_call_id": "c1", "content": "5"}
    assert out[1]["tool_call_id"] == "c2" and out[1]["content"].startswith("error: the arguments are not JSON")
    assert tool_replies(Calc(), {"role": "assistant", "content": "5"}) is None
    assert tool_replies(envs.load("guess_number"), msg) is None  # no call_tool: respond decides


def test_the_trainer_never_targets_the_environments_tokens():
    pytest.importorskip("torch")
    from slurmrl.runtime.trainer import rollouts

    sample = {"prompt_ids": [1, 2], "completion_ids": [10, 11, 20, 21, 22, 12], "completion_mask": [1, 1, 0, 0, 0, 1],
              "logprobs": [-0.1, -0.2, None, None, None, -0.3], "advantage": 1.5}
    [row] = rollouts.split([sample], 0, 1, 1, seq_len=64)
    assert row.input_ids[0].tolist() == [1, 2, 10, 11, 20, 21, 22, 12]
    assert row.targets[0].tolist() == [False, False, True, True, False, False, False, True]
    assert row.at_targets("old_logp", "cpu").tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert rollouts.target_tokens([sample], 64) == 3
    assert rollouts.target_tokens([sample], 5) == 2  # the row cut after the first environment token
    plain = {"prompt_ids": [1, 2], "completion_ids": [10, 11], "logprobs": [-0.1, math.nan]}
    assert rollouts.target_tokens([plain], 64) == 2
