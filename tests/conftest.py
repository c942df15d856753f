"""Shared test setup. The real local Slurm cluster fixture lives in tests/slurm_cluster.py."""

import pytest
from vllm_python import VllmPython

pytest_plugins = ["slurm_cluster"]


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct as a safetensors folder, built once per session (dequantizing the GGUF
    costs ~25 s on two cores); tests read it and never write into it."""
    from slurmrl.runtime import smollm2

    return smollm2.build(tmp_path_factory.mktemp("smollm2") / "model")


@pytest.fixture(scope="session")
def vllm_python(tmp_path_factory):
    """One process with vLLM imported that runs the parser checks' scripts (tests/vllm_python.py):
    ``vllm_python.run(SCRIPT, *argv, input=...)`` answers like ``subprocess.run``."""
    proc = VllmPython(tmp_path_factory.mktemp("vllm_python") / "stderr.log")
    yield proc
    proc.close()
