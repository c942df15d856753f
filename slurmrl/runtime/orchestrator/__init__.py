"""The orchestrator: prompts -> rollouts -> rewards -> batches for the trainer, weight updates on
every server. ``python -m slurmrl.runtime.orchestrator --config FILE ...`` (``loop``); ``hybrid``
(sleep/wake with the trainer on the same GPUs), ``adapters`` (a LoRA policy's adapters),
``judge_client`` (rewards scored by the job's judge)."""
