"""slurmrl's vLLM plugin (entry point group ``vllm.general_plugins``, name ``slurmrl``): registers
the ``gloo`` weight-transfer backend (``slurmrl.runtime.vllm.gloo_transfer``) in vLLM's two
weight-transfer factories, the servers' and the trainer's.

vLLM calls ``register()`` in every process it starts (API server, engine core, workers), maybe more
than once; the engine module is imported only when a server or trainer asks for the backend.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path

GROUP, NAME = "vllm.general_plugins", "slurmrl"
BACKEND = "gloo"  # --weight-transfer-config '{"backend": "gloo"}'
ENGINE_MODULE = "slurmrl.runtime.vllm.gloo_transfer"


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    for factory, cls in ((WeightTransferEngineFactory, "GlooWeightTransferEngine"),
                         (WeightTransferTrainerFactory, "GlooTrainerWeightTransferEngine")):
        if BACKEND not in factory._registry:
            factory.register_engine(BACKEND, ENGINE_MODULE, cls)


def make_visible(folder: Path) -> None:
    """Make this plugin visible to the vLLM servers this process starts, also where the installed
    slurmrl predates its entry point (an editable install whose metadata is older than the
    checkout): a dist-info holding only the entry point goes on PYTHONPATH. Where the install has
    it, nothing changes. For tests and benchmarks; a job's environment has slurmrl installed."""
    if any(e.name == NAME for e in entry_points(group=GROUP)):
        return
    info = folder / "slurmrl_vllm_plugin-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: slurmrl-vllm-plugin\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{NAME} = {__name__}:register\n")
    checkout = str(Path(__file__).resolve().parents[3])  # where this slurmrl is, for the plugin's import
    paths = [str(folder), checkout, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
