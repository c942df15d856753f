"""SGLang recipes rendered, and the one-line refusals of bad ones; shared by the SGLang plan tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmrl.app.build import Rendered, build
from slurmrl.errors import UserError
from slurmrl.rundir import tomlw


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(tomlw.dumps(data))
    return path


def render(tmp_path: Path, recipe: dict | Path) -> Rendered:
    """What ``slurmrl render`` builds from the recipe (a gallery file or a table)."""
    (tmp_path / "run").mkdir(exist_ok=True)  # the run dir, made by the CLI
    return build(recipe if isinstance(recipe, Path) else write(tmp_path, recipe), [], run_dir=tmp_path / "run")


def refusal(tmp_path: Path, recipe: dict) -> str:
    with pytest.raises(UserError) as e:
        render(tmp_path, recipe)
    msg = str(e.value)
    assert "\n" not in msg
    return msg
