"""Weight sync as one typed value (``slurmrl.contract.weight_sync``): the recipe's two fields become
it once, every settings file carries it in one form that reads back the same, and nothing outside
the contract compares a mode's name."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmrl.contract import weight_sync as ws
from slurmrl.contract.weight_sync import Broadcast, Filesystem
from slurmrl.rundir.tomlw import dumps
from slurmrl.settings.orchestrator import OrchestratorSettings
from slurmrl.settings.trainer import TrainerSettings

PACKAGE = Path(__file__).resolve().parent.parent / "slurmrl"

values = st.one_of(st.just(Filesystem()),
                   st.builds(Broadcast, backend=st.sampled_from(ws.BACKENDS), timeout_s=st.integers(1, 86400)))


@given(values)
def test_the_serialized_form_reads_back(value):
    assert ws.from_dict(ws.to_dict(value)) == value
    assert ws.from_dict(tomllib.loads(dumps({"weight_sync": ws.to_dict(value)}))["weight_sync"]) == value


def test_from_recipe():
    assert ws.from_recipe("filesystem", 600) == Filesystem() and not Filesystem().by_broadcast
    b = ws.from_recipe("nccl", 30)
    assert b == Broadcast("nccl", 30) and b.by_broadcast and b.between_gpus and not b.on_shared_gpu
    assert Broadcast("ipc", 1).on_shared_gpu and Broadcast("gloo", 1).ours
    with pytest.raises(ValueError, match="one of filesystem, nccl, ipc, gloo"):
        ws.from_recipe("rdma", 600)
    with pytest.raises(ValueError, match="timeout_s"):
        Broadcast("nccl", 0)
    with pytest.raises(ValueError, match="mode = 'broadcast'"):
        ws.from_dict({"mode": "broadcast", "backend": "nccl"})


def test_the_recipe_spells_every_mode():
    from slurmrl.recipe.trainer import Trainer

    assert tuple(Trainer.model_fields["weight_sync"].annotation.__args__) == ws.MODES


BASE = dict(run_dir="/r", model="m", served_model_name="m", max_steps=1)


@pytest.mark.parametrize("value", [Filesystem(), Broadcast("gloo", 120)])
def test_the_settings_carry_the_typed_value(value):
    o = OrchestratorSettings(**BASE, weight_sync=value)
    dumped = o.model_dump(mode="json", exclude_none=True)
    assert dumped["weight_sync"] == ws.to_dict(value)
    assert OrchestratorSettings.model_validate(dumped).weight_sync == value
    t = TrainerSettings(run_dir="/r", kind="rl", model="m", world_size=1, global_batch=1, weight_sync=value)
    assert TrainerSettings.model_validate(t.model_dump(mode="json")).weight_sync == value


def test_a_bad_table_is_refused():
    with pytest.raises(ValueError, match="weight_sync"):
        OrchestratorSettings(**BASE, weight_sync={"mode": "nccl"})


# a mode's name compared as text: `== "filesystem"`, `weight_sync != ...`, `backend == "ipc"`, ...
COMPARISON = re.compile(r"""[=!]=\s*["'](filesystem|nccl|ipc|gloo)["']|["'](filesystem|nccl|ipc|gloo)["']\s*[=!]="""
                        r"""|weight_sync\s*[=!]=|backend\s*[=!]=\s*["'](nccl|ipc|gloo)""")


def test_no_weight_sync_mode_is_compared_outside_the_contract():
    found = [f"{p.relative_to(PACKAGE)}:{n}: {line.strip()}"
             for p in sorted(PACKAGE.rglob("*.py")) if "contract" not in p.parts
             for n, line in enumerate(p.read_text().splitlines(), 1) if COMPARISON.search(line)]
    assert not found, "ask the typed value (slurmrl.contract.weight_sync):\n" + "\n".join(found)
