"""The judge client's settings: the ``judge`` table of ``RUN_DIR/components/orchestrator.toml``, read by
``slurmrl.runtime.orchestrator.judge_client``. Where the judge serves is not here: the job script passes its URLs
to the orchestrator (``--judge-urls``), from the judge's ready files."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from slurmrl.settings.section import Section

JUDGE_TEMPLATES = {  # judge.template when left out, per judge.kind
    "generative": "Rate the answer from 0 (wrong) to 10 (right).\nQuestion: {prompt}\nAnswer: {completion}\nRating:",
    "reward_model": "{prompt}{completion}",
}


def template_fields(template: str) -> list[str]:
    """The placeholders of a judge template (``{prompt}``, ``{completion}``, a task's fields), or a
    ValueError saying what is wrong: only plain names, no format specs; ``{{``/``}}`` are braces."""
    import string

    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"{e} (write {{{{ and }}}} for literal braces)") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise ValueError(f"placeholder {{{name}}} is not a plain name such as {{prompt}} or {{completion}}")
        if spec or conversion:
            raise ValueError(f"placeholder {{{name}}} takes no format spec or conversion")
        names.append(name)
    if "completion" not in names:
        raise ValueError("has no {completion} placeholder: the judge would never see what it scores")
    return names


class JudgeKnobs(Section):
    """The [judge] fields the orchestrator's scoring client reads (``slurmrl.runtime.orchestrator.judge_client``);
    ``slurmrl.settings.judge.JudgeSettings`` extends this with what the planner derives."""

    kind: Literal["generative", "reward_model"] = Field(
        "generative",
        description="`generative`: an LLM judge; it completes the template (greedy) and the reward is the first number "
        "of its reply over `max_score`. `reward_model`: a sequence-classification model served by vLLM's pooling "
        "runner (`--runner pooling`); the reward is its score for the template's text (`/classify`, no activation).",
    )
    template: Annotated[str, Field(min_length=1, max_length=65536)] | None = Field(
        None,
        description="What the judge reads per sample: `{completion}`, `{prompt}` and the task's own fields (e.g. "
        "`{target}`) as placeholders, `{{`/`}}` for braces. Default: `generative` "
        f"{JUDGE_TEMPLATES['generative']!r}; `reward_model` {JUDGE_TEMPLATES['reward_model']!r}.",
    )
    max_tokens: int = Field(
        16, ge=1, le=4096, description="`generative`: tokens the judge may write per reply (1-4096)."
    )
    max_score: float = Field(
        10.0, gt=0, le=1e6,
        description="`generative`: the top of the judge's scale; the reward is the reply's first number clamped to "
        "0..max_score, over max_score (a reply without a number scores 0; above 0, at most 1000000).",
    )
    batch_size: int = Field(
        16, ge=1, le=4096,
        description="Samples per request to the judge (one `/v1/completions` or `/classify` call; 1-4096). A step's "
        "requests go to the judge servers at once, two per server.",
    )
    timeout: int = Field(120, ge=1, le=86400, description="Seconds one request to the judge may take (1-86400).")
    retries: int = Field(
        3, ge=0, le=100,
        description="Tries after a failed request (connection refused or reset, timeout, HTTP 429/5xx), each on the "
        "next judge server after a doubling pause from 1 s; then, once a judge server answers /health again (within "
        "judge.startup_timeout), as many more; then the orchestrator fails naming the judge (0-100).",
    )

    @field_validator("template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None:
            template_fields(v)
        return v




class JudgeSettings(JudgeKnobs):
    """The recipe's [judge] scoring fields (defaults there), with the template resolved for its kind."""

    template: str = Field(description="judge.template, or the default of judge.kind.")
    served_model_name: str = Field(description="The model name the judge's servers answer to.")
    wait_s: float = Field(
        0.0, ge=0, le=86400, description="judge.startup_timeout: when every try failed without an answer, how long to "
        "wait for a judge server's /health to answer again (its supervisor restarts a dead one) before one more round "
        "of tries; 0: fail at once.",
    )


