"""Shared test setup. The real local Slurm cluster fixture lives in tests/slurm_cluster.py."""

import pytest

pytest_plugins = ["slurm_cluster"]


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct as a safetensors folder, built once per session (dequantizing the GGUF
    costs ~25 s on two cores); tests read it and never write into it."""
    from slurmrl.runtime.fixtures import smollm2

    return smollm2.build(tmp_path_factory.mktemp("smollm2") / "model")
