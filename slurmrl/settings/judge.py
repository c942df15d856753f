"""The judge client's settings: the ``judge`` table of ``RUN_DIR/components/orchestrator.toml``, read by
``slurmrl.runtime.orchestrator.judge_client``. Where the judge serves is not here: the job script passes its URLs
to the orchestrator (``--judge-urls``), from the judge's ready files."""

from __future__ import annotations

from pydantic import Field

from slurmrl.recipe.schema import JUDGE_TEMPLATES, JudgeKnobs, Recipe


class JudgeSettings(JudgeKnobs):
    """The recipe's [judge] scoring fields (defaults there), with the template resolved for its kind."""

    template: str = Field(description="judge.template, or the default of judge.kind.")
    served_model_name: str = Field(description="The model name the judge's servers answer to.")


def judge_settings(recipe: Recipe) -> JudgeSettings | None:
    """What the planner writes for ``recipe``'s judge (None without a [judge] section)."""
    j = recipe.judge
    if j is None:
        return None
    knobs = j.model_dump(include=set(JudgeKnobs.model_fields))
    knobs["template"] = j.template or JUDGE_TEMPLATES[j.kind]
    return JudgeSettings(**knobs, served_model_name=j.model.served_model_name)
