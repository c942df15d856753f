"""Where the trainer finds ``trainer.dataset``: standard library only, so the preflight probe asks the
same question on the node, in the job's container, before a model is loaded.

The trainer reads one local JSONL file (``data.py``); it downloads nothing. A relative path is
looked up from the directory the job's steps start in, then in the run dir.
"""

from __future__ import annotations

from pathlib import Path


def locate(dataset: str, run_dir: Path) -> Path | None:
    for p in (Path(dataset).expanduser(), Path(run_dir) / dataset):
        if p.exists():
            return p.resolve()
    return None


def problem(dataset: str, run_dir: Path) -> str | None:
    """Why the trainer cannot read ``dataset``, in one line; None when it is a file."""
    found = locate(dataset, run_dir)
    if found is None:
        return (f"dataset {dataset!r} not found (looked for {Path(dataset).expanduser().absolute()} and "
                f"{Path(run_dir) / dataset}); the trainer reads one local JSONL file")
    if not found.is_file():
        return f"dataset {dataset!r} is {found}, not a file; the trainer reads one local JSONL file"
    return None
