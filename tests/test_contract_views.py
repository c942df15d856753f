"""The preflight probe's view of the planner's files (``slurmrl.contract.views``): for every gallery
recipe, plan.json and components/*.toml as the planner writes them read back through the views, with
the values of the planner's typed models; a broken file is one line naming the field."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from slurmrl.app.build import build, plan_json
from slurmrl.contract.reader import ContractError
from slurmrl.contract.views import OrchestratorView, PlanView, TrainerView

GALLERY = Path(__file__).resolve().parent.parent / "slurmrl" / "recipes"


@pytest.mark.parametrize("recipe", sorted(p.stem for p in GALLERY.glob("*.toml")))
def test_the_views_read_what_the_planner_writes(recipe, tmp_path):
    out = build(GALLERY / f"{recipe}.toml", [], run_dir=str(tmp_path))
    view = PlanView.from_json(json.loads(plan_json(out.plan)))
    assert view.nvlink_domain == tuple(out.plan.nvlink_domain)
    assert [c.name for c in view.components] == [c.name for c in out.plan.components]
    for c, typed in zip(view.components, out.plan.components):
        assert (c.group, c.first_node, c.main) == (typed.group, typed.first_node, typed.main)
        assert [(i.rank, i.node, i.local, i.gpus, i.ports) for i in c.instances] == \
               [(i.rank, i.node, i.local, tuple(i.gpus), dict(i.ports)) for i in typed.instances]
    assert view.tasks == sum(len(c.instances) for c in out.plan.components)
    files = out.files
    if recipe.startswith(("rl", "sft")):  # the programs' settings are there to read
        assert {"components/trainer.toml"} | ({"components/orchestrator.toml"} if recipe.startswith("rl") else set()) \
            <= set(files)
    if "components/orchestrator.toml" in files:
        o = OrchestratorView.from_json(tomllib.loads(files["components/orchestrator.toml"]))
        s = out.plan.component("orchestrator").settings
        assert (o.environment.name, o.environment.args) == (s.environment, s.environment_args or {})
        assert o.judge == (s.judge is not None)
    if "components/trainer.toml" in files:
        t = TrainerView.from_json(tomllib.loads(files["components/trainer.toml"]))
        s = out.plan.component("trainer").settings
        assert (t.kind, t.dataset) == (s.kind, s.dataset)


def test_eval_with_its_own_environment():
    o = OrchestratorView.from_json({"environment": "arithmetic", "eval": {"heldout": False, "environment": "guess_number",
                                                                           "environment_args": {"n": 2}}})
    assert o.eval_environment is not None and o.eval_environment.args == {"n": 2} and not o.judge
    assert OrchestratorView.from_json({"environment": "a", "eval": {"heldout": True, "environment": "a"}}).eval_environment is None


@pytest.mark.parametrize("data, field", [
    ({}, "the plan: key 'components' is missing"),
    ({"components": [{"name": "x", "group": "0", "first_node": 0, "instances": []}]},
     "the plan: key 'components[x].group' must be a whole number, got str"),
    ({"components": [{"name": "x", "group": 0, "first_node": 0, "instances": [{"rank": 0, "node": 0}]}]},
     "the plan: key 'components[x].instances[0].local' is missing"),
])
def test_a_broken_plan_names_the_field(data, field):
    with pytest.raises(ContractError) as e:
        PlanView.from_json(data)
    assert str(e.value) == field
    with pytest.raises(ContractError, match="^trainer.toml: key 'kind' is missing$"):
        TrainerView.from_json({"dataset": "d"})
