"""The rollout batch (``slurmrl.contract.rollouts``): one definition that the orchestrator writes and the
trainer reads; a round trip through JSON, a one-line error naming the file and the key, and the
orchestrator's own written batch read by the trainer's reader."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmrl.contract.reader import ContractError
from slurmrl.contract.rollouts import RolloutBatch, Sample
from slurmrl.runtime import step_files
from slurmrl.runtime.orchestrator import batch

ids = st.lists(st.integers(0, 1 << 20), max_size=12).map(tuple)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def samples(draw) -> Sample:
    completion = draw(ids)
    n = len(completion)
    mask = draw(st.none() | st.lists(st.sampled_from((0, 1)), min_size=n, max_size=n).map(tuple))
    return Sample(prompt_ids=draw(ids), completion_ids=completion,
                  logprobs=tuple(draw(st.lists(st.none() | st.floats(max_value=0.0, allow_nan=False), min_size=n,
                                               max_size=n))),
                  routed_experts=draw(st.none() | st.text(min_size=1, max_size=8)), completion_mask=mask,
                  reward=draw(finite), advantage=draw(finite))


batches = st.builds(RolloutBatch, st.integers(1, 10**6), st.integers(0, 10**6),
                    st.lists(samples(), max_size=5).map(tuple))


@given(batches)
def test_a_batch_survives_json_and_back(b):
    assert RolloutBatch.loads(b.dumps(), "f.json") == b
    assert RolloutBatch.loads(json.dumps(json.loads(b.dumps())), "f.json").to_json() == b.to_json()


def test_keys_are_written_once_in_the_order_they_always_were():
    s = Sample(prompt_ids=(1,), completion_ids=(2, 3), logprobs=(-0.5, None), completion_mask=(1, 0),
               reward=1.0, advantage=0.25)
    assert list(s.to_json()) == ["prompt_ids", "completion_ids", "logprobs", "completion_mask", "reward", "advantage"]
    plain = Sample(prompt_ids=(1,), completion_ids=(2,), logprobs=(-0.5,), reward=0.0, advantage=0.0)
    assert "completion_mask" not in plain.to_json() and "routed_experts" not in plain.to_json()
    assert list(RolloutBatch(3, 2, (s,)).to_json()) == ["step", "policy_step", "samples"]


GOOD = {"step": 2, "policy_step": 1, "samples": [
    {"prompt_ids": [1, 2], "completion_ids": [3], "logprobs": [-0.1], "reward": 1.0, "advantage": 0.5}]}


@pytest.mark.parametrize("change, words", [
    (lambda d: d.pop("policy_step"), "f.json: key 'policy_step' is missing"),
    (lambda d: d.update(step="2"), "f.json: key 'step' must be a whole number, got str"),
    (lambda d: d.update(samples={}), "f.json: key 'samples' must be a list of samples, got dict"),
    (lambda d: d["samples"][0].pop("advantage"), "f.json: key 'samples[0].advantage' is missing"),
    (lambda d: d["samples"][0].update(completion_ids=[3.5]),
     "f.json: key 'samples[0].completion_ids' must be a list of whole numbers"),
    (lambda d: d["samples"][0].update(logprobs=["x"]), "f.json: key 'samples[0].logprobs' must be a list of numbers"),
    (lambda d: d["samples"][0].update(completion_mask=[1, 1]),
     "f.json: key 'samples[0]' completion_mask: 2 entries for 1 completion tokens"),
    (lambda d: d["samples"][0].update(completion_mask=[2]), "f.json: key 'samples[0].completion_mask' must hold only"),
    (lambda d: d["samples"][0].update(reward=True), "f.json: key 'samples[0].reward' must be a number, got bool"),
])
def test_a_batch_that_breaks_the_contract_is_one_line_naming_the_file_and_key(change, words):
    data = json.loads(json.dumps(GOOD))
    change(data)
    with pytest.raises(ContractError) as e:
        RolloutBatch.from_json(data, "f.json")
    assert str(e.value).startswith(words) and "\n" not in str(e.value)
    assert RolloutBatch.from_json(GOOD, "f.json").samples[0].completion_ids == (3,)


def test_the_orchestrators_written_batch_is_what_the_trainers_reader_trains_on(tmp_path):
    """The writer (``orchestrator.batch``) and the reader (``trainer.rollouts``): the file between them."""
    pytest.importorskip("torch")
    from slurmrl.runtime.trainer import rollouts

    text = [{"prompt_ids": [5, 6], "completion_ids": [7, 8], "logprobs": [-0.5, -1.5], "text": "ab"},
            {"prompt_ids": [5, 6], "completion_ids": [9], "logprobs": [-0.25], "text": "c"}]
    chat = [{"prompt_ids": [1], "completion_ids": [2, 3, 4], "completion_mask": [1, 0, 1],
             "logprobs": [-0.1, None, -0.2], "reward": 1, "messages": []},
            {"prompt_ids": [1], "completion_ids": [2], "completion_mask": [1], "logprobs": [-0.3], "reward": 0,
             "messages": []}]
    written = batch.write(tmp_path, RolloutBatch(4, 2, tuple(batch.scored([text, chat], [1.0, 0.0, 1, 0]))))
    assert written == step_files.rollout_path(tmp_path, 4)
    on_disk = json.loads(written.read_text())
    assert on_disk["samples"][2] == {"prompt_ids": [1], "completion_ids": [2, 3, 4], "logprobs": [-0.1, None, -0.2],
                                     "completion_mask": [1, 0, 1], "reward": 1.0,
                                     "advantage": pytest.approx(1.0, abs=1e-3)}
    got = rollouts.read_batch(written)
    assert got == RolloutBatch.read(written) and (got.step, got.policy_step, len(got.samples)) == (4, 2, 4)
    assert [s.advantage for s in got.samples] == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-3)
    (row,) = rollouts.split(got.samples, 0, 1, micro=4, seq_len=64)
    assert row.input_ids[0].tolist() == [5, 6, 7, 8, 5, 6, 9, 1, 2, 3, 4, 1, 2]
    assert rollouts.target_tokens(got.samples, 64) == int(row.targets.sum()) == 2 + 1 + 2 + 1
    old = row.at_targets("old_logp", "cpu").tolist()
    assert old == pytest.approx([-0.5, -1.5, -0.25, -0.1, -0.2, -0.3]) and not any(math.isnan(v) for v in old)


def test_the_trainer_stops_on_a_broken_batch_with_one_line(tmp_path):
    pytest.importorskip("torch")
    from slurmrl.runtime.trainer import rollouts

    path = step_files.rollout_path(tmp_path, 1)
    step_files.write_json_atomic(path, {**GOOD, "samples": [{"prompt_ids": [1]}]})
    with pytest.raises(SystemExit) as e:
        rollouts.read_batch(path)
    assert str(e.value) == f"slurmrl: trainer: {path}: key 'samples[0].completion_ids' is missing"
