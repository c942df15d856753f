"""Trainer runtime: SFT and RL (GRPO-style PPO-clip) on one process per GPU, FSDP2 when > 1.

Started by torchrun (one worker per GPU; on CPU, gloo)::

    python -m slurmrl.runtime.trainer --config RUN_DIR/components/trainer.toml

Files in the run dir (steps count from 1; "step N" is the state after N optimizer steps):

- ``rollouts/step-NNNNNN.json`` (RL, read): the batch for step N, written by the orchestrator
  atomically (temporary name, then rename): a ``slurmrl.contract.rollouts.RolloutBatch``, ``{"step",
  "policy_step", "samples": [{"prompt_ids", "completion_ids", "logprobs", "reward", "advantage"}]}``;
  ``logprobs`` are the inference logprobs of the completion tokens. The trainer polls for it.
- ``weights/step-NNNNNN/`` (RL: after every step; SFT: after the last): an HF folder
  (``config.json`` with untied embeddings, ``model*.safetensors``, tokenizer files), built under
  ``weights/.step-NNNNNN.tmp`` and renamed; ``READY`` is written last. The newest
  ``keep_checkpoints`` are kept. With ``trainer.lora`` (see ``lora.py``): the adapter alone,
  ``adapter_config.json`` + ``adapter_model.safetensors`` in PEFT's format.
- ``checkpoints/step-NNNNNN/``: ``model/`` (HF folder, float32), ``optimizer.pt``,
  ``state.json`` (step, data position), ``rng-rank<R>.pt``; built under a temporary name,
  renamed, ``DONE`` written last. With ``trainer.lora``: ``adapter/`` instead of ``model/``. Every ``checkpoint_every`` steps, at the last step, and on
  TERM/INT (then the exit code is 143). On start the newest checkpoint with ``DONE`` is resumed.
  With ``trainer.checkpoint_stage_dir`` each rank writes its part node-locally and a background thread
  copies it here before the same rename (``stage.py``).
- ``merged/`` (``trainer.lora``, after the last step): base + adapter merged, a plain HF folder.
- ``metrics/trainer.jsonl``: one JSON line per step (rank 0); wandb (offline unless
  ``WANDB_MODE`` says otherwise) under ``RUN_DIR/wandb``.
"""
