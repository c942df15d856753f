"""Runtimes that run inside job steps: ``python -m slurmrl.runtime.<role> --config FILE``.

Each reads only its own component config (written by ``slurmrl render``); none parses the
recipe. Heavy imports (torch, vllm) happen inside the role modules, never at package import.
"""
