"""CLI commands that talk to Slurm: submit, status, logs, cancel, diff (filled in by the Slurm issue)."""

from __future__ import annotations

HANDLERS: dict = {}


def add_parsers(sub, recipe_args) -> None:
    """Register the Slurm-facing subcommands on the main parser."""
