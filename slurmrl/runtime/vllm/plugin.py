"""slurmrl's vLLM plugin (entry point group ``vllm.general_plugins``, name ``slurmrl``): registers
the ``gloo`` weight-transfer backend (``slurmrl.runtime.vllm.gloo_transfer``) in vLLM's two
weight-transfer factories, the servers' and the trainer's.

vLLM calls ``register()`` in every process it starts (API server, engine core, workers), maybe more
than once; the engine module is imported only when a server or trainer asks for the backend.
"""

from __future__ import annotations

BACKEND = "gloo"  # --weight-transfer-config '{"backend": "gloo"}'
ENGINE_MODULE = "slurmrl.runtime.vllm.gloo_transfer"


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    for factory, cls in ((WeightTransferEngineFactory, "GlooWeightTransferEngine"),
                         (WeightTransferTrainerFactory, "GlooTrainerWeightTransferEngine")):
        if BACKEND not in factory._registry:
            factory.register_engine(BACKEND, ENGINE_MODULE, cls)
