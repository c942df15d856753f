"""verifiers v1 tasksets (``verifiers-v1:TASKSET_ID``) without a server: the real verifiers 0.4 in its own
virtualenv (.venv-verifiers, from scripts/install.sh), across the process boundary of
``slurmrl.contract.envwire``, on the taskset written in tests/support/verifiers_envs/slurmrl_vf1_sums.py. The
real-vLLM rollout is in tests/test_smollm2.py, the Slurm run (a LoRA policy)
in tests/test_lora_policy_cluster.py; plan's
check of the name in tests/test_verifiers_env.py."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from slurmrl import envs
from slurmrl.contract import envwire
from slurmrl.contract.reader import ContractError
from slurmrl.envs import verifiers_v1

ENVS = Path(__file__).parent / "support" / "verifiers_envs"
NEEDS_VENV = pytest.mark.skipif(not verifiers_v1.python().exists(), reason=(
    f"verifiers 0.4 is not installed in {verifiers_v1.python()}: run bash scripts/install.sh "
    f"(or set {verifiers_v1.PYTHON_VAR})"))


@pytest.fixture
def on_path(monkeypatch):
    """tests/support/verifiers_envs importable in the environment's process, as an installed taskset package is."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ENVS), os.environ.get("PYTHONPATH")) if p))


@pytest.fixture
def sums(on_path):
    env = envs.load("verifiers-v1:slurmrl_vf1_sums", {"tasks": 8, "raise_on": 1})
    yield env
    env.obj.close()


def said(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def answer(task: dict) -> str:
    a, b = task["messages"][1]["content"].removeprefix("What is ").split("?")[0].split(" + ")
    return str(int(a) + int(b))


@NEEDS_VENV
def test_a_v1_taskset_gives_chat_tasks_and_its_weighted_rewards(sums):
    assert sums.chat and sums.kind == "chat" and envs.kind("verifiers-v1:anything") == "chat"
    assert (sums.obj.count, sums.obj.taskset, sums.obj.version) == (8, "SumsTaskset", "0.4.0")
    tasks = sums.prompts(random.Random(3), 5)
    for t in tasks:  # the system prompt as a system message, the text prompt as the user's (the null harness's)
        assert [m["role"] for m in t["messages"]] == ["system", "user"] and t["messages"][0]["content"] == "You add numbers."
        assert 0 <= t["index"] < 8
    task = next(t for t in tasks if t["index"] != 1)
    assert sums.respond(task, said(answer(task))) == []  # one model turn
    assert sums.reward(task, said(answer(task))) == 1.0  # correct (0.5) + exact (0.5)
    assert sums.reward(task, said(f"It is {answer(task)}")) == 0.5
    assert sums.reward(task, said("no idea")) == 0.0
    scored = sums.obj.scores(task, said(answer(task)))
    assert scored.rewards == {"correct": 1.0, "exact": 1.0}
    assert sums.split_key(task) == f"verifiers-v1:slurmrl_vf1_sums:{task['key']}" and len(task["key"]) == 64
    assert len({sums.split_key(t) for t in sums.obj.tasks(list(range(8)))}) == len(
        {answer(t) + t["messages"][1]["content"] for t in sums.obj.tasks(list(range(8)))})


@NEEDS_VENV
def test_a_reward_that_raises_fails_that_rollout_only(sums):
    broken, fine = sums.obj.tasks([1, 2])
    with pytest.raises(verifiers_v1.EnvironmentFailed, match="ValueError: the reward broke"):
        sums.reward(broken, said(answer(broken)))
    assert sums.reward(fine, said(answer(fine))) == 1.0  # the environment's process goes on


@NEEDS_VENV
def test_what_the_adapter_cannot_run_is_one_named_line(on_path):
    with pytest.raises(SystemExit) as e:
        envs.load("verifiers-v1:no-such-taskset")
    assert str(e.value.code).startswith("slurmrl: environment 'verifiers-v1:no-such-taskset': no verifiers v1 "
                                        "taskset 'no-such-taskset' is installed in ")
    assert "\n" not in str(e.value.code)
    with pytest.raises(SystemExit, match=r"^slurmrl: environment 'verifiers-v1:slurmrl_vf1_sums': .*infinite"):
        envs.load("verifiers-v1:slurmrl_vf1_sums", {"infinite": True})
    with pytest.raises(SystemExit, match=r"^slurmrl: environment 'verifiers-v1:slurmrl_vf1_sums': .*tasks"):
        envs.load("verifiers-v1:slurmrl_vf1_sums", {"tasks": "many"})


@NEEDS_VENV
def test_an_environment_process_that_dies_is_named(sums):
    sums.obj.proc.kill()
    with pytest.raises(verifiers_v1.EnvironmentFailed, match="its process .* exited with code -9"):
        sums.reward(sums.obj.tasks([0])[0], said("1"))


def test_without_its_virtualenv_it_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv(verifiers_v1.PYTHON_VAR, str(tmp_path / "none" / "python"))
    with pytest.raises(SystemExit) as e:
        envs.load("verifiers-v1:slurmrl_vf1_sums")
    assert str(e.value.code) == (f"slurmrl: environment 'verifiers-v1:slurmrl_vf1_sums' needs verifiers 0.4 in a "
                                 f"virtualenv of its own: {tmp_path}/none/python does not exist (run bash "
                                 "scripts/install.sh (it makes .venv-verifiers with verifiers 0.4), or set "
                                 "SLURMRL_VERIFIERS_V1_PYTHON)")


def test_the_wire_messages_round_trip_and_name_what_is_wrong():
    msgs = [envwire.Load("t", {"tasks": 2}), envwire.Loaded(3, "T", "0.4.0"), envwire.Tasks([0, 2]),
            envwire.TaskList([envwire.WireTask(0, "k", [{"role": "user", "content": "hi"}])]),
            envwire.Score(1, [{"role": "assistant", "content": "5"}]), envwire.Scored(0.5, {"a": 1.0, "b": None}),
            envwire.Failed("it broke")]
    for m in msgs:
        line = envwire.to_json(m)
        assert "\n" not in line and envwire.from_json(line) == m
    for line, why in [('{"op": "score", "index": 1}', "'score': key 'messages' is missing"),
                      ('{"op": "tasks", "indices": [true]}', r"key 'indices\[0\]' must be a whole number, got bool"),
                      ('{"op": "loaded", "count": "3", "taskset": "T", "version": "v"}',
                       "key 'count' must be a whole number, got str"),
                      ('{"op": "nope"}', "key 'op' is none of load, .*: 'nope'"),
                      ("[1]", "must be an object, got list"), ("{", "not JSON")]:
        with pytest.raises(ContractError, match=why):
            envwire.from_json(line)
