"""No silent knobs (issue 15): every recipe field takes effect in every shape that accepts it, or
`plan` refuses it there with one line naming it.

The walk: every leaf field of the recipe schema (nested sections and optional ones, so fields
added later are walked too) x every gallery recipe. For each, a value other than the recipe's is
applied the way ``--set`` applies it (``slurmrl.recipe.load.apply_overrides``), then validated,
planned and rendered in-process. The field passes when the rendered run dir differs from the
recipe's own, or when validation/planning refuses it with a ``UserError`` naming the field (or its
section). A value the schema itself refuses (out of range, malformed) says nothing about the
shape, nor does a refusal naming another field (the value conflicts with the recipe): the walk
tries the next value. A field no value of which could be tried in a recipe must take effect in
another one. Fields of an optional section the recipe lacks are walked too (setting one adds the
section), except where the section needs a field of its own first (``[container]`` its image).

"The rendered run dir" is every file ``render`` writes except ``recipe.toml``, which echoes the
recipe itself. ``job.sbatch`` is a function of the plan alone (``render_script``), so the plan is
compared first (plan.json and components/*.toml are the plan) and the script is rendered only
when the plans are equal.

A changed file is not yet an effect: what counts is what the program does with it. Keys of
components/<name>.toml that the program does not read in a kind (``UNREAD``) do not count, nor do
those the orchestrator does not read for the environments it runs: it loads them as it would at start
(``slurmrl.envs.load``: their declared kinds) and, when none is a chat environment, the chat-only keys
(``slurmrl.envs.protocol.CHAT_ONLY``) do nothing (``runtime_unread``). And the orchestrator's start is
run on the planned settings (``start_refusal``): a field it refuses, by name, counts as refused.
``test_the_walk_compares_what_the_runtime_does`` shows a check that counted any changed
components/orchestrator.toml as an effect letting the chat-only settings of a text environment through.
"""

from __future__ import annotations

import knob_walk
import pytest
from knob_walk import OUTSIDE_RUN_DIR, PLAUSIBLE, ROOT, RUN_DIR, check_field, walk
from recipe_leaves import leaves

from slurmrl.app.plan import planned
from slurmrl.envs.protocol import CHAT_ONLY
from slurmrl.errors import UserError
from slurmrl.plan import rules
from slurmrl.recipe.user_set import user_set

# ---- tests -------------------------------------------------------------------------------------


def test_the_walk_sees_every_section():
    paths = {p for p, _ in leaves()}
    for known in ("name", "slurm.time", "container.image", "trainer.dataset", "orchestrator.environment_args",
                  "inference.kv_connector", "inference.prefill.tp", "inference.router.policy",
                  "inference.kv_offload.cpu_gb", "placement.port_base"):
        assert known in paths
    assert set(OUTSIDE_RUN_DIR) <= paths, "a field named in OUTSIDE_RUN_DIR is gone from the schema"
    assert set(PLAUSIBLE) <= paths, "a field named in PLAUSIBLE is gone from the schema"


def test_every_field_acts_or_is_refused_in_every_gallery_shape():
    problems = walk()
    assert not problems, "silent knobs (a field that changes nothing and is not refused):\n" + "\n".join(problems)


def test_the_walk_finds_an_explicit_default_the_shape_never_reads(monkeypatch):
    """``trainer.weight_sync`` on an SFT job: any value is refused, 'filesystem' (its default) too; a rule
    that refuses only the broadcasts is a finding of the walk."""
    recipe = ROOT / "recipes" / "sft-1node.toml"
    assert walk([recipe], {"trainer.weight_sync"}) == []
    with pytest.raises(UserError, match="only applies to kind 'rl'"):
        planned(recipe, ["trainer.weight_sync='filesystem'"], run_dir=RUN_DIR)
    monkeypatch.setattr(rules, "changed", lambda section, name: name != "weight_sync" and user_set(section, name))
    problems = walk([recipe], {"trainer.weight_sync"})
    assert len(problems) == 1 and "its default 'filesystem' set explicitly: same" in problems[0], problems


def test_the_walk_finds_a_silent_knob(monkeypatch):
    """The walk itself: a rule that stops refusing makes its field a finding, here one that only
    reaches a key of components/trainer.toml the SFT trainer never reads (UNREAD)."""
    recipe = ROOT / "recipes" / "sft-1node.toml"
    assert walk([recipe], {"trainer.kl_coef", "trainer.lr"}) == []
    monkeypatch.setattr(rules, "check_applies", lambda r: None)
    problems = walk([recipe], {"trainer.kl_coef", "trainer.lr"})
    assert len(problems) == 1 and problems[0].startswith("sft-1node.toml: trainer.kl_coef: neither changes"), problems


def test_the_walk_compares_what_the_runtime_does(monkeypatch):
    """The chat-only settings of a text environment (issue 33): the planner refuses them; without that rule the
    orchestrator's start does (it loads the environment and sees its kind); without that either, the walk finds
    them silent, since the orchestrator does not read them for a text environment. A check that counted any
    changed components/orchestrator.toml as an effect (the walk before) would have let all three through."""
    recipe = ROOT / "recipes" / "rl-debug.toml"
    chat_only = {f for f in CHAT_ONLY if f.startswith("orchestrator.")}
    assert chat_only == {"orchestrator.max_turns", "orchestrator.max_rollout_tokens", "orchestrator.env_timeout_s"}
    paths = chat_only | {"orchestrator.max_tokens"}  # one the text rollouts read: it acts throughout
    assert walk([recipe], paths) == []
    assert all(check_field(recipe, f)[1].endswith("only applies to a chat environment's conversations; "
                                                  "orchestrator.environment 'reverse_text' is a text environment "
                                                  "(one completion per prompt): remove the setting)") for f in chat_only)
    monkeypatch.setattr(rules, "check_kinds", lambda r: None)  # the planner stops refusing them
    assert walk([recipe], paths) == []
    assert all(f"refused (at the orchestrator's start: {f})" in check_field(recipe, f)[1] for f in chat_only)
    monkeypatch.setattr(knob_walk, "refuse_chat_only", lambda *a: None)  # and so does the orchestrator
    problems = walk([recipe], paths)
    assert sorted(p.split(": ")[1] for p in problems) == sorted(chat_only), problems
    assert all("neither changes the run dir nor is refused" in p for p in problems)
    monkeypatch.setattr(knob_walk, "runtime_unread", lambda settings: set())  # the old check
    assert walk([recipe], paths) == []


@pytest.mark.parametrize("recipe, overrides, field, says", [
    ("sft-1node", ["trainer.kl_coef=0.1"], "trainer.kl_coef", "only applies to kind 'rl'"),
    ("sft-1node", ["trainer.clip_eps=0.3"], "trainer.clip_eps", "only applies to kind 'rl'"),
    ("sft-1node", ["model.dtype='bfloat16'"], "model.dtype", "the trainer trains in trainer.dtype"),
    ("sft-1node", ["model.max_model_len=4096"], "model.max_model_len", "trainer.seq_len"),
    ("sft-1node", ["model.served_name='x'"], "model.served_name", "inference servers"),
    ("sft-1node", ["slurm.cpu_partition='cpu'"], "slurm.cpu_partition", "orchestrator.placement = 'own'"),
    ("rl-debug", ["trainer.dataset='/d.jsonl'"], "trainer.dataset", "only applies to kind 'sft'"),
    ("inference-replicas", ["slurm.heartbeat_timeout=60"], "slurm.heartbeat_timeout", "inference.startup_timeout"),
    ("inference-replicas", ["inference.kv_offload.cpu_gb=8"], "inference.kv_offload.cpu_gb", "(kind is 'none')"),
    ("inference-kv-offload", ["inference.kv_offload.mooncake_device='mlx5_0'"], "inference.kv_offload.mooncake_device",
     "only applies to kv_offload.kind 'mooncake'"),
    ("inference-pd", ["inference.tp=2"], "inference.tp", "inference.prefill.tp and inference.decode.tp"),
    ("rl-debug", ["orchestrator.max_turns=3"], "orchestrator.max_turns", "only applies to a chat environment"),
    ("rl-debug", ["orchestrator.env_timeout_s=5"], "orchestrator.env_timeout_s", "only applies to a chat environment"),
    ("rl-1node", ["orchestrator.max_rollout_tokens=99"], "orchestrator.max_rollout_tokens", "a text environment"),
    ("rl-judge", ["inference.tool_call_parser='hermes'"], "inference.tool_call_parser", "'judge' is a text environment"),
    ("inference-pd", ["inference.nodes=2"], "inference.nodes", "inference.prefill.nodes"),
    ("rl-debug", ["inference.router.extra_args=['--x']"], "inference.router.extra_args", "no router runs"),
    ("inference-replicas", ["inference.router.session_header='X-User-ID'"], "inference.router.session_header",
     "cannot be told which header"),
])
def test_a_field_the_shape_does_not_use_is_refused_saying_what_applies(recipe, overrides, field, says):
    with pytest.raises(UserError) as e:
        planned(ROOT / "recipes" / f"{recipe}.toml", overrides, run_dir=RUN_DIR)
    assert e.value.field == field and says in e.value.message, e.value


def test_an_empty_cpu_partition_is_left_out():
    """What lets `--set orchestrator.placement=...` move rl-multinode's orchestrator off its own group."""
    planned(ROOT / "recipes" / "rl-multinode.toml", ["orchestrator.placement=trainer", "slurm.cpu_partition=''"],
            run_dir=RUN_DIR)
