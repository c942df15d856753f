"""verifiers environments (``verifiers:ENV_ID``) without a server: the adapter onto the chat protocol,
driven with the messages the orchestrator would give it, on environments written in
tests/support/verifiers_envs (a SingleTurnEnv and a ToolEnv; never a hub download). The real-vLLM rollouts are
in tests/test_smollm2.py (they share its server)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurmrl import envs
from slurmrl.errors import UserError
from slurmrl.plan.env_rules import check_environment

ENVS = Path(__file__).parent / "support" / "verifiers_envs"
NOWHERE = ["http://127.0.0.1:9"]  # the states' OpenAI client points there; these tests never sample


@pytest.fixture
def on_path(monkeypatch):
    """tests/support/verifiers_envs importable, as an installed environment package is."""
    monkeypatch.syspath_prepend(str(ENVS))


def loaded(name: str, args: dict | None = None):
    env = envs.load(name, args)
    env.use_servers(NOWHERE, "tiny", None)
    return env


def said(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def call(name: str, arguments: str, id: str = "call-1") -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


def test_a_single_turn_env_gives_chat_tasks_and_its_rubrics_reward(on_path):
    env = loaded("verifiers:slurmrl_vf_sum", {"bonus": 0.25})
    tasks = env.prompts(random.Random(0), 4)
    assert env.chat and all("messages" in t for t in tasks) and env.tools is None
    for t in tasks:  # the system prompt as verifiers formats it, then the row's question
        assert [m["role"] for m in t["messages"]] == ["system", "user"]
        assert t["messages"][0]["content"] == "You add numbers."
    task = env.obj.task(0)
    assert task["messages"][1]["content"] == "What is 2 + 3? Answer with the number only."
    rollout = env.begin(task)
    assert env.respond(rollout, said("5")) == []  # a SingleTurnEnv is done after one turn
    assert env.reward(rollout, said("5")) == pytest.approx(1.0 + 2 * 0.25)  # correct + weight 2 x bonus
    assert env.reward(env.begin(task), said("7")) == pytest.approx(2 * 0.25)
    assert env.split_key(task) == "slurmrl_vf_sum:0"


def test_a_tool_env_answers_tool_calls_with_its_env_response(on_path):
    env = loaded("verifiers:slurmrl_vf_tools")
    assert [t["function"]["name"] for t in env.tools] == ["add", "divide"]
    add = env.tools[0]["function"]
    assert add["description"] == "Add two whole numbers." and add["parameters"]["required"] == ["a", "b"]
    assert not env.answers_tools  # tool calls go to the environment's env_response, its own way
    [task] = env.prompts(random.Random(0), 1)
    assert [m["role"] for m in task["messages"]] == ["system", "user", "assistant", "user"]  # with its few-shot example
    rollout = env.begin(task)
    first = call("add", '{"a": 17, "b": 25}')
    replies = env.respond(rollout, [first])
    assert replies == [{"role": "tool", "tool_call_id": "call-1", "content": "42"}]
    convo = [first, *replies, *said("The sum is 42.")]
    assert env.respond(rollout, convo) == []  # a turn without tool calls ends a ToolEnv's rollout
    assert env.reward(rollout, convo) == 1.0
    assert env.reward(env.begin(task), said("42")) == 0.0  # no tool message: the rubric's 0
    bad = env.respond(env.begin(task), [call("add", "not json")])  # verifiers tells the model, as it would
    assert bad[0]["role"] == "tool" and bad[0]["content"]


def test_a_tool_envs_max_turns_ends_the_conversation(on_path):
    env = loaded("verifiers:slurmrl_vf_tools", {"max_turns": 2})
    rollout = env.begin(env.obj.task(0))
    first = call("add", '{"a": 1, "b": 2}')
    convo = [first, *env.respond(rollout, [first]), call("add", '{"a": 3, "b": 4}', "call-2")]
    assert env.respond(rollout, convo) == []


def test_what_raises_in_the_environment_raises_to_the_orchestrator(on_path):
    """The orchestrator counts it an environment error and scores the rollout 0 (tests/test_smollm2.py)."""
    tools = loaded("verifiers:slurmrl_vf_tools")
    with pytest.raises(RuntimeError, match=r"ToolCallError.*ZeroDivisionError: division by zero"):
        tools.respond(tools.begin(tools.obj.task(0)), [call("divide", '{"a": 1, "b": 0}')])
    sums = loaded("verifiers:slurmrl_vf_sum", {"raise_on": 1})
    assert sums.reward(sums.begin(sums.obj.task(0)), said("5")) == 1.5
    vf = __import__("verifiers")
    vf.setup_logging("INFO")  # an environment may set verifiers' logging up again (clearing its handlers)
    try:
        with pytest.raises(RuntimeError, match="reward function bonus_points: the rubric broke"):
            sums.reward(sums.begin(sums.obj.task(1)), said("8"))
    finally:
        vf.setup_logging(os.environ.get("VF_LOG_LEVEL"))  # as verifiers set it up when imported


def test_loading_keeps_the_orchestrators_signal_handlers(on_path):
    """verifiers' environments install SIGINT/SIGTERM handlers that exit; the orchestrator's planned stop
    needs its own."""
    def mine(*_):
        return None

    before = signal.signal(signal.SIGTERM, mine)
    try:
        envs.load("verifiers:slurmrl_vf_sum")
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


def test_an_environment_not_installed_or_broken_is_one_named_line(on_path, tmp_path, monkeypatch):
    with pytest.raises(SystemExit) as e:
        envs.load("verifiers:no-such-env")
    assert str(e.value.code) == ("slurmrl: environment 'verifiers:no-such-env': no verifiers environment 'no-such-env' "
                                 "is installed (no module 'no_such_env' in the job's Python: install its package there)")
    (tmp_path / "slurmrl_vf_broken.py").write_text("def load_environment(n: int = 1):\n    return 1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit, match=r"^slurmrl: environment 'verifiers:slurmrl_vf_broken' with arguments "
                                         r"\{\}: ZeroDivisionError in slurmrl_vf_broken.py:2: division by zero$"):
        envs.load("verifiers:slurmrl_vf_broken")
    with pytest.raises(SystemExit, match="names no verifiers environment id"):
        envs.load("verifiers:")


def test_without_verifiers_installed_it_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)  # import verifiers then fails as if not installed
    monkeypatch.delitem(sys.modules, "slurmrl.envs.verifiers_env", raising=False)
    with pytest.raises(SystemExit) as e:
        envs.load("verifiers:slurmrl_vf_sum")
    assert str(e.value.code) == ("slurmrl: environment 'verifiers:slurmrl_vf_sum' needs the verifiers extra: "
                                 "pip install 'slurmrl[verifiers]'")


@pytest.mark.parametrize(("prefix", "what"), [("verifiers:", "verifiers environment"),
                                              ("verifiers-v1:", "verifiers v1 taskset")])
def test_plan_accepts_a_verifiers_environment_without_importing_verifiers(prefix, what):
    """Both lines, 0.1.x (``verifiers:``) and v1 (``verifiers-v1:``): plan checks the name only; an empty id
    is a UserError (exit 2) naming the field."""
    code = ("import sys; from slurmrl.plan.env_rules import check_environment; "
            f"check_environment('orchestrator', '{prefix}anything', {{'n': 1}}); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('verifiers', 'torch', 'datasets')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    with pytest.raises(UserError, match=f"names no {what} id"):
        check_environment("orchestrator", f"{prefix} ", {})
