"""Rewards from the job's judge: prompts from a JSONL dataset (or a built-in environment's prompts),
each completion scored by the [judge] component (an LLM judge or a reward model served by vLLM).

    [orchestrator]
    environment = "judge"
    environment_args = { dataset = "prompts.jsonl" }    # or { prompts_from = "arithmetic" }

``dataset``: one JSON object per line with ``prompt`` (text) and any other fields, which
``judge.template`` may name (``{reference}``); an absolute path or one relative to the directory the
job starts in. ``prompts_from``: the prompts (and fields, e.g. ``{target}``) of a built-in
environment with its default arguments. The orchestrator hands over the judge (``use_judge``) and
scores a whole step at once (``rewards``), which the judge client batches.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import ClassVar, Literal

from slurmrl.envs.arithmetic import Arithmetic
from slurmrl.envs.reverse_text import ReverseText

PROMPT_SOURCES = {"reverse_text": ReverseText, "arithmetic": Arithmetic}  # what prompts_from may name


class Judge:
    kind: ClassVar[Literal["text"]] = "text"

    def __init__(self, prompts_from: str = "", dataset: str = ""):
        if bool(prompts_from) == bool(dataset):
            raise ValueError("the judge environment takes its prompts from one place: dataset (a JSONL file) or "
                             "prompts_from (a built-in environment)")
        if prompts_from and prompts_from not in PROMPT_SOURCES:
            raise ValueError(f"prompts_from {prompts_from!r} is not a built-in environment "
                             f"({', '.join(PROMPT_SOURCES)})")
        self.source = PROMPT_SOURCES[prompts_from]() if prompts_from else None
        self.dataset, self.judge = dataset, None
        self._rows: list[dict] | None = None

    def use_judge(self, judge) -> None:
        """The orchestrator's ``slurmrl.runtime.orchestrator.judge_client.JudgeClient`` for the job's judge."""
        self.judge = judge

    def preflight(self) -> None:
        """``submit --preflight`` on the orchestrator's node: the dataset is there and readable."""
        if self.dataset:
            self.rows()

    def rows(self) -> list[dict]:
        if self._rows is None:
            path = Path(self.dataset).expanduser()
            try:
                lines = path.read_text().splitlines()
            except OSError as e:
                raise SystemExit(f"slurmrl: environment 'judge': cannot read dataset {str(path)!r}: "
                                 f"{e.strerror or e} (relative paths start where the job starts)") from None
            rows = []
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise SystemExit(f"slurmrl: environment 'judge': {path}:{n}: not JSON: {e}") from None
                if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                    raise SystemExit(f"slurmrl: environment 'judge': {path}:{n}: needs an object with a text 'prompt'")
                rows.append(row)
            if not rows:
                raise SystemExit(f"slurmrl: environment 'judge': {path} holds no prompts")
            self._rows = rows
        return self._rows

    def prompts(self, rng: random.Random, n: int) -> list[dict]:
        if self.source is not None:
            return self.source.prompts(rng, n)
        rows = self.rows()
        return [dict(rng.choice(rows)) for _ in range(n)]

    def rewards(self, tasks: list[dict], completions: list[str]) -> list[float]:
        """One reward per (task, completion), scored through the judge in batches."""
        if self.judge is None:
            raise SystemExit("slurmrl: environment 'judge' needs the job's [judge] (the orchestrator got no --judge-urls)")
        return self.judge.score([{**t, "completion": c} for t, c in zip(tasks, completions)])

    def reward(self, task: dict, completion: str) -> float:
        return self.rewards([task], [completion])[0]
