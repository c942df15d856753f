"""Shared test setup. The real local Slurm cluster fixture lives in tests/slurm_cluster.py."""

pytest_plugins = ["slurm_cluster"]
