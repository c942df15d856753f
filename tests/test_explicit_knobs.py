"""No silent knob, by what the user set (issue 27 item 7): a field given in a shape that never reads
it is refused even when its value is the default; a resolved recipe (a run dir's recipe.toml or
lock.toml, every default written out) still renders as before; an empty path is refused, naming
the field, before anything is planned or written.
"""

from __future__ import annotations

import contextlib
import io
import json
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmrl import cli
from slurmrl.app.build import build
from slurmrl.app.plan import planned
from slurmrl.errors import UserError
from slurmrl.plan import plan
from slurmrl.recipe.load import load_recipe, validate
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.user_set import unresolve, user_set

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("*.toml"))
RUN_DIR = "/cluster/runs/explicit"

# (gallery recipe, --set of a field to its default where the shape never reads it, the field named, words said)
EXPLICIT_DEFAULTS = [
    ("sft-1node", "trainer.kl_coef=0.0", "trainer.kl_coef", "only applies to kind 'rl'"),
    ("sft-1node", "trainer.clip_eps=0.2", "trainer.clip_eps", "only applies to kind 'rl'"),
    ("sft-1node", "trainer.token_mask_high=8.0", "trainer.token_mask_high", "only applies to kind 'rl'"),
    ("sft-1node", "model.dtype='auto'", "model.dtype", "only applies to inference servers"),
    ("sft-1node", "placement.colocate=false", "placement.colocate", "only applies to kind 'rl'"),
    ("rl-multinode", "placement.share_gpus=false", "placement.share_gpus", "only applies with placement.colocate"),
    ("inference-replicas", "slurm.heartbeat_timeout=1800", "slurm.heartbeat_timeout", "inference.startup_timeout"),
    ("inference-replicas", "inference.kv_offload.cpu_gb=0", "inference.kv_offload.cpu_gb", "(kind is 'none')"),
    ("inference-replicas", "inference.kv_offload.disk_gb=0", "inference.kv_offload.disk_gb", "(kind is 'none')"),
    ("inference-replicas", "inference.kv_offload.mooncake_protocol='rdma'", "inference.kv_offload.mooncake_protocol",
     "only applies to kv_offload.kind 'mooncake'"),
    ("inference-replicas", "inference.share_nodes=false", "inference.share_nodes", "only applies to mode 'pd'"),
    ("inference-replicas", "inference.kv_connector='NixlConnector'", "inference.kv_connector",
     "only applies to mode 'pd'"),
    ("inference-replicas", "inference.kv_load_failure_policy='fail'", "inference.kv_load_failure_policy",
     "only applies to mode 'pd'"),
    ("inference-replicas", "inference.router.cache_threshold=0.3", "inference.router.cache_threshold", "cache_aware"),
    ("inference-pd", "inference.tp=1", "inference.tp", "mode 'pd' sizes each role"),
    ("inference-pd", "inference.nodes=1", "inference.nodes", "mode 'pd' sizes each role"),
    ("inference-pd", "inference.kv_transfer_protocol='rdma'", "inference.kv_transfer_protocol", "MooncakeConnector"),
    ("inference-pd-mooncake", "inference.kv_buffer_device='gpu'", "inference.kv_buffer_device", "NixlConnector"),
    ("rl-debug", "inference.router.policy='consistent_hash'", "inference.router.policy", "no router runs"),
    ("rl-debug", "inference.router.extra_args=[]", "inference.router.extra_args", "no router runs"),
    ("rl-debug", "model.stage_dir='/tmp/slurmrl-models'", "model.stage_dir", "model.stage = 'node-local'"),
    ("rl-judge", "judge.model.stage='shared'", "judge.model.stage", "[model] only"),
    ("inference-dynamo-debug", "inference.enable_eplb=false", "inference.enable_eplb", "vLLM-server knob"),
    ("inference-dynamo-debug", "inference.vllm_extra={}", "inference.vllm_extra", "vLLM-server knob"),
    ("inference-dynamo-debug", "inference.kv_buffer_device='gpu'", "inference.kv_buffer_device",
     "Dynamo's disaggregation moves KV itself"),
    ("inference-dynamo-debug", "inference.router.policy='consistent_hash'", "inference.router", "router_mode"),
    ("inference-dynamo-debug", "inference.kv_offload.kind='none'", "inference.kv_offload", "vLLM-server"),
    ("inference-dynamo-debug", 'inference.dynamo.dp_launch="per_rank"', "inference.dynamo.dp_launch",
     "only engine 'vllm' with dp > 1"),
    ("inference-dynamo-debug", "inference.extra_args=[]", "inference.extra_args", "inference.dynamo.extra_args"),
    ("inference-dynamo-debug", "inference.admin_endpoints=false", "inference.admin_endpoints",
     "not a key of backend 'dynamo' (a key of backend 'vllm'): the admin endpoints"),
    ("inference-dynamo-debug", "inference.enforce_eager=false", "inference.enforce_eager", "a vLLM flag"),
    ("inference-dynamo-debug", "model.dtype='auto'", "model.dtype", "engine 'mocker'"),
    ("inference-dynamo-debug", "model.trust_remote_code=false", "model.trust_remote_code", "a vLLM flag"),
]


@pytest.mark.parametrize("recipe, override, field, says", EXPLICIT_DEFAULTS,
                         ids=[f"{r}:{o}" for r, o, _, _ in EXPLICIT_DEFAULTS])
def test_a_field_set_to_its_default_where_nothing_reads_it_is_refused(recipe, override, field, says):
    with pytest.raises(UserError) as e:
        planned(ROOT / "recipes" / f"{recipe}.toml", [override], run_dir=RUN_DIR)
    assert e.value.field == field and says in e.value.message, e.value


def test_the_same_value_set_where_the_shape_reads_it_is_taken():
    planned(ROOT / "recipes" / "rl-debug.toml", ["trainer.kl_coef=0.0", "trainer.clip_eps=0.2", "model.dtype='auto'"],
            run_dir=RUN_DIR)
    planned(ROOT / "recipes" / "inference-pd.toml", ["inference.kv_connector='NixlConnector'"], run_dir=RUN_DIR)
    planned(ROOT / "recipes" / "rl-judge.toml", ["judge.max_tokens=16"], run_dir=RUN_DIR)


def test_a_reward_model_judge_refuses_a_generative_field_at_its_default():
    with pytest.raises(UserError) as e:
        planned(ROOT / "recipes" / "rl-judge.toml", ["judge.kind='reward_model'", "judge.max_tokens=16"],
                run_dir=RUN_DIR)
    assert e.value.field == "judge.max_tokens", e.value


def test_user_set_is_what_the_recipe_names():
    r = validate({"name": "x", "kind": "sft", "model": {"path": "m"}, "trainer": {"dataset": "/d", "lr": 1e-5}})
    assert user_set(r.trainer, "lr") and user_set(r.trainer, "dataset") and not user_set(r.trainer, "kl_coef")
    assert not user_set(r.slurm, "time")


# ---- resolved recipes: every default written out --------------------------------------------------


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_a_run_dirs_resolved_recipe_renders_what_it_was_rendered_from(recipe, tmp_path):
    first = build(recipe, run_dir=tmp_path / "run")
    again = tmp_path / "recipe.toml"
    again.write_text(first.files["recipe.toml"])
    second = build(again, run_dir=tmp_path / "run", source_name=recipe.name)
    assert second.plan == first.plan
    assert second.files["job.sbatch"] == first.files["job.sbatch"]


def test_a_resolved_recipe_counts_only_what_differs_from_the_defaults():
    r = load_recipe(ROOT / "recipes" / "sft-1node.toml")
    data = tomllib.loads(build(ROOT / "recipes" / "sft-1node.toml", run_dir=RUN_DIR).files["recipe.toml"])
    assert "kl_coef" in data["trainer"]  # written out ...
    again = validate(data, resolved=True)
    assert not user_set(again.trainer, "kl_coef")  # ... but not set
    assert again == r.model_copy(update={"output_dir": again.output_dir})
    with pytest.raises(UserError) as e:  # read as a recipe someone wrote, the defaults are set
        plan(validate(data), RUN_DIR)
    assert e.value.field in ("trainer.clip_eps", "trainer.kl_coef", "model.dtype", "placement.colocate",
                             "placement.share_gpus", "slurm.heartbeat_timeout"), e.value


def test_set_on_a_resolved_recipe_counts_as_set(tmp_path):
    text = build(ROOT / "recipes" / "sft-1node.toml", run_dir=RUN_DIR).files["recipe.toml"]
    (tmp_path / "recipe.toml").write_text(text)
    with pytest.raises(UserError) as e:
        planned(tmp_path / "recipe.toml", ["trainer.kl_coef=0.0"], run_dir=RUN_DIR)
    assert e.value.field == "trainer.kl_coef"


def test_unresolve_keeps_sections_the_recipe_has_and_drops_ones_always_there():
    data = {"name": "x", "kind": "rl", "model": {"path": "m"}, "trainer": {"lr": 1e-5},
            "inference": {"router": {"policy": "consistent_hash"}}, "slurm": {"time": "01:00:00"}}
    out = unresolve(Recipe, data)
    assert out == {"name": "x", "kind": "rl", "model": {"path": "m"}, "trainer": {}, "inference": {}}


# ---- empty paths ---------------------------------------------------------------------------------

PATHS = ["model.path", "model.stage_dir", "output_dir", "templates_dir", "python.venv", "python.uv_project",
         "python.executable", "trainer.dataset", "container.image", "container.workdir", "container.cache",
         "inference.kv_offload.disk_path", "judge.model.path"]
BASE = {"trainer.dataset": "sft-1node", "inference.kv_offload.disk_path": "inference-kv-offload",
        "judge.model.path": "rl-judge", "container.image": "inference-dynamo-agg",
        "container.workdir": "inference-dynamo-agg", "container.cache": "inference-dynamo-agg"}


def render_cli(recipe: Path, override: str, tmp_path: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["render", str(recipe), "--run-dir", str(tmp_path / "run"), "--set", override])
    return rc, err.getvalue()


@pytest.mark.parametrize("field", PATHS)
@settings(max_examples=4, deadline=None)
@given(blank=st.sampled_from(["", " ", "\t", "   "]))
def test_an_empty_path_is_refused_naming_the_field(field, blank, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("empty")
    recipe = ROOT / "recipes" / f"{BASE.get(field, 'rl-debug')}.toml"
    rc, err = render_cli(recipe, f"{field}={json.dumps(blank)}", tmp_path)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"slurmrl: error: {field}: is empty") and "give a path" in err, err
    assert not (tmp_path / "run").exists()


def test_an_empty_served_name_is_refused():
    with pytest.raises(UserError) as e:
        planned(ROOT / "recipes" / "rl-debug.toml", ["model.served_name=''"], run_dir=RUN_DIR)
    assert e.value.field == "model.served_name"
