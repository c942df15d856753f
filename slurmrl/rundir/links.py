"""RUN_DIR/links.json: how run dirs relate. ``again_of`` (the run dir this one submits again),
``again_as`` (the run dirs that submit this one again, oldest first), ``sweep`` (the sweep dir a
point belongs to); other keys are left alone. Read into :class:`Links`, checked; written whole, atomically."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir.atomic import write_text
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import kind, read_json
from slurmrl.rundir.text import is_one_line

KEYS = ("again_of", "again_as", "sweep")


@dataclass(frozen=True)
class Links:
    again_of: str | None = None
    again_as: tuple[str, ...] = ()
    sweep: str | None = None

    def to_json(self) -> dict:
        out: dict = {}
        if self.again_of is not None:
            out["again_of"] = self.again_of
        if self.again_as:
            out["again_as"] = list(self.again_as)
        if self.sweep is not None:
            out["sweep"] = self.sweep
        return out


def _path(value, where: str) -> str:
    if not (isinstance(value, str) and value and is_one_line(value)):
        shown = repr(value[:40]) if isinstance(value, str) else kind(value)
        raise UserError(where, f"should be a run dir's path (one line of text), not {shown}")
    return value


def read_links(run_dir: Path) -> Links:
    """The run dir's links (none when it has no links.json); anything else is one line naming the file."""
    path = RunDir(run_dir).links
    data = read_json(path, missing=None)
    if data is None:
        return Links()
    if not isinstance(data, dict):
        raise UserError(str(path), f"should hold a table of links, not {kind(data)}; fix or remove it")
    again_of = data.get("again_of")
    again_as = data.get("again_as", [])
    sweep = data.get("sweep")
    if not isinstance(again_as, list):
        raise UserError(f"{path} again_as", f"should be a list of run dirs, not {kind(again_as)}")
    return Links(None if again_of is None else _path(again_of, f"{path} again_of"),
                 tuple(_path(v, f"{path} again_as") for v in again_as),
                 None if sweep is None else _path(sweep, f"{path} sweep"))


def write_links(run_dir: Path, links: Links) -> None:
    write_text(RunDir(run_dir).links, json.dumps(links.to_json(), indent=1) + "\n")


def links_text(links: Links) -> str:
    """links.json's text (for a run dir written whole by write_run_dir)."""
    return json.dumps(links.to_json(), indent=1) + "\n"


def add_link(run_dir: Path, key: str, value: str) -> None:
    """Set ``key`` (``again_of``, ``sweep``) or append to ``again_as`` in links.json."""
    _path(value, key)
    links = read_links(run_dir)
    if key == "again_as":
        links = Links(links.again_of, tuple(v for v in links.again_as if v != value) + (value,), links.sweep)
    elif key == "again_of":
        links = Links(value, links.again_as, links.sweep)
    elif key == "sweep":
        links = Links(links.again_of, links.again_as, value)
    else:
        raise ValueError(f"not a link: {key}")
    write_links(run_dir, links)
