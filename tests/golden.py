"""Golden scripts: sbatch/<recipe>.sbatch is what recipes/<recipe>.toml renders to, and
sbatch/slurmrl-functions.sh the helper file each of them sources.

Regenerate after a template or planner change (then read the diff as a user would):

    .venv/bin/python tests/golden.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
GOLDEN = ROOT / "sbatch"
RUN_ROOT = "/cluster/runs"  # a fixed run dir so the goldens do not depend on the checkout


def recipes() -> list[Path]:
    return sorted(RECIPES.glob("*.toml"))


def render(recipe: Path) -> str:
    from slurmrl.app.build import build

    return build(recipe, run_dir=f"{RUN_ROOT}/{recipe.stem}").script


def functions() -> str:
    """sbatch/slurmrl-functions.sh: the helper file every job.sbatch sources (the same for all)."""
    from slurmrl.render.script import render_functions

    return render_functions()


def main() -> int:
    from slurmrl.render.script import FUNCTIONS

    GOLDEN.mkdir(exist_ok=True)
    (GOLDEN / FUNCTIONS).write_text(functions())
    print(f"sbatch/{FUNCTIONS}")
    for stale in set(GOLDEN.glob("*.sbatch")) - {GOLDEN / f"{r.stem}.sbatch" for r in recipes()}:
        stale.unlink()
    for recipe in recipes():
        (GOLDEN / f"{recipe.stem}.sbatch").write_text(render(recipe))
        print(f"sbatch/{recipe.stem}.sbatch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
