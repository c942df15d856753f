"""[eval]: evaluation during training (kind `rl`); the fields the orchestrator's evaluation reads are
``slurmrl.settings.eval.EvalKnobs``."""

from __future__ import annotations

from slurmrl.settings.eval import EvalKnobs


class Eval(EvalKnobs):
    """Every `every` trainer steps the orchestrator samples held-out prompts with the newest weights and
    scores them; rows in RUN_DIR/metrics/eval.jsonl, W&B, `slurmrl status` and `slurmrl plot`.
    docs/rl.md: "Evaluation during training"."""
