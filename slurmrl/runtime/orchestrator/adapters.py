"""A LoRA policy's adapters on the inference servers (no torch here: the orchestrator imports it).

The trainer publishes ``weights/step-N/`` as a PEFT adapter folder (``adapter_config.json`` +
``adapter_model.safetensors``, see ``slurmrl.runtime.trainer.lora``) instead of full weights. Every
server hot-loads it under a new name (vLLM's ``/v1/load_lora_adapter``; the servers run with
``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), the previous one is unloaded, and the
orchestrator's requests name the new one. A name is never reused: vLLM keys loaded adapters by name.
"""

from __future__ import annotations

from pathlib import Path

from slurmrl.runtime.vllm import client

CONFIG = "adapter_config.json"


def is_adapter(path: Path) -> bool:
    """A published folder holds a LoRA adapter (not full weights)."""
    return (Path(path) / CONFIG).is_file()


def adapter_name(step: int) -> str:
    """The name the servers serve the adapter of trainer step ``step`` under."""
    return f"policy-step-{step}"


def swap(urls: list[str], path: Path, step: int, current: str | None) -> str:
    """Load the adapter at ``path`` on every server as ``adapter_name(step)``, then unload ``current``
    (the previous adapter's name; None when the servers serve the base model). Returns the new name.
    Raises client.VLLMError naming the server that failed."""
    name = adapter_name(step)
    client.load_lora(urls, name, str(path))
    if current is not None and current != name:
        client.unload_lora(urls, current)
    return name
