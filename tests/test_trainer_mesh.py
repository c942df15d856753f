"""[trainer.parallel] at plan: every impossible mesh (products that are not the trainer's processes, ep
that does not divide dp_shard x cp or the model's experts, ep on a dense model, cp that does not divide
seq_len, Ulysses where cp does not divide the heads, ring where 2 x cp does not divide seq_len) is one
line naming its field; every possible one resolves (dp_shard and cp_style filled in) and `slurmrl plan`
shows it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmrl.app.build import build
from slurmrl.errors import UserError
from slurmrl.plan import hub_shapes, mesh
from slurmrl.render.summary import summary
from slurmrl.settings.trainer import Parallel

MOE = {"model_type": "qwen3_moe", "num_experts": 12, "num_attention_heads": 8}
DENSE = {"model_type": "llama", "num_attention_heads": 6}


def model(root: Path, config: dict) -> str:
    folder = root / config["model_type"]
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def style_of(cp, style, heads) -> str | None:
    """The attention style a cp group runs: the one set, else Ulysses where cp divides the heads, else ring."""
    return style if style or cp == 1 else ("ulysses" if heads % cp == 0 else "ring")


def possible(world, rep, shard, cp, ep, seq_len, config, style=None) -> bool:
    """The rules, written plainly: what resolve must accept."""
    if world % (rep * cp):
        return False
    shard = world // (rep * cp) if shard is None else shard
    experts = config.get("num_experts")
    style = style_of(cp, style, config["num_attention_heads"])
    return (rep * shard * cp == world and (shard * cp) % ep == 0 and seq_len % cp == 0
            and (ep == 1 or (experts is not None and experts % ep == 0 and rep == 1))
            and (cp == 1 or (config["num_attention_heads"] % cp == 0 if style == "ulysses"
                             else seq_len % (2 * cp) == 0)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=st.integers(1, 64), rep=st.integers(1, 8), shard=st.none() | st.integers(1, 32),
       cp=st.integers(1, 8), ep=st.integers(1, 16), seq_len=st.integers(1, 4096), moe=st.booleans(),
       style=st.sampled_from([None, "ulysses", "ring"]))
def test_a_mesh_resolves_exactly_when_it_is_possible(tmp_path, world, rep, shard, cp, ep, seq_len, moe, style):
    config = MOE if moe else DENSE
    path = model(tmp_path, config)
    p = Parallel(dp_replicate=rep, dp_shard=shard, cp=cp, ep=ep, cp_style=style)
    if possible(world, rep, shard, cp, ep, seq_len, config, style):
        out = mesh.resolve(p, world, seq_len, path)
        assert out.dp_replicate * out.dp_shard * out.cp == world and out.ep == ep
        assert out.cp_style == style_of(cp, style, config["num_attention_heads"])
    else:
        with pytest.raises(UserError) as e:
            mesh.resolve(p, world, seq_len, path)
        assert e.value.field in {f"trainer.parallel.{f}" for f in ("dp_replicate", "dp_shard", "cp", "ep", "cp_style")}
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("parallel, field, words", [
    (dict(dp_shard=3), "dp_shard", "= 3, the trainer has 4"),
    (dict(cp=3), "cp", "does not divide the trainer's 4"),
    (dict(dp_replicate=8), "dp_replicate", "does not divide"),
    (dict(ep=8), "ep", "dp_shard 4 x cp 1"),
    (dict(ep=4), "ep", "6 routed experts"),
    (dict(cp=2, ep=1), None, None),
])
def test_named_refusals(tmp_path, parallel, field, words):
    path = model(tmp_path, dict(MOE, num_experts=6))
    p = Parallel(**parallel)
    if field is None:
        assert mesh.resolve(p, 4, 1024, path).dp_shard == 2
        return
    with pytest.raises(UserError) as e:
        mesh.resolve(p, 4, 1024, path)
    assert e.value.field == f"trainer.parallel.{field}" and words in e.value.message


def test_ep_on_a_dense_model_and_cp_against_seq_len_and_heads(tmp_path):
    dense = model(tmp_path, DENSE)
    with pytest.raises(UserError, match="not a mixture-of-experts") as e:
        mesh.resolve(Parallel(ep=2), 2, 64, dense)
    assert e.value.field == "trainer.parallel.ep"
    with pytest.raises(UserError, match="seq_len 63") as e:
        mesh.resolve(Parallel(cp=2), 2, 63, dense)
    with pytest.raises(UserError, match="6 attention heads") as e:  # Ulysses asked: heads must divide; ring named
        mesh.resolve(Parallel(cp=4, cp_style="ulysses"), 4, 64, dense)
    assert e.value.field == "trainer.parallel.cp_style" and 'set cp_style = "ring"' in e.value.message
    assert mesh.resolve(Parallel(cp=4), 4, 64, dense).cp_style == "ring"  # the default where heads do not divide
    assert mesh.resolve(Parallel(cp=3), 3, 96, dense).cp_style == "ulysses"  # ... and where they do
    with pytest.raises(UserError, match="2 x cp = 8 does not divide trainer.seq_len 36") as e:
        mesh.resolve(Parallel(cp=4), 4, 36, dense)  # ring, by default: zigzag chunks
    assert e.value.field == "trainer.parallel.cp"
    with pytest.raises(UserError, match="2 x cp = 6") as e:
        mesh.resolve(Parallel(cp=3, cp_style="ring"), 3, 99, dense)
    assert e.value.field == "trainer.parallel.cp"
    assert mesh.resolve(Parallel(cp=2), 2, 64, "Qwen/Qwen3-4B").cp_style is None  # a hub id: the trainer decides
    assert mesh.resolve(Parallel(ep=2), 2, 64, "Qwen/Qwen3-30B-A3B").dp_shard == 2


def test_ep_over_a_hub_id_plan_has_no_numbers_for_is_taken_with_one_warning_line():
    """GLM-5.1 is a mixture-of-experts model no listed shape knows, and its name says nothing plan could
    trust: plan warns in one line and the trainer checks the experts when it loads the model."""
    for path in ("zai-org/GLM-5.1-FP8", "Qwen/Qwen3-4B"):
        assert mesh.resolve(Parallel(ep=8), 8, 64, path).ep == 8
        line = mesh.unknown_experts(Parallel(ep=8), path)
        assert line is not None and "\n" not in line and repr(path) in line and "trainer.parallel.ep = 8" in line
    assert mesh.unknown_experts(Parallel(ep=1), "zai-org/GLM-5.1-FP8") is None
    assert mesh.unknown_experts(Parallel(ep=2), "Qwen/Qwen3-30B-A3B") is None  # a listed shape: counted


RECIPE = Path(__file__).resolve().parent.parent / "slurmrl" / "recipes" / "rl-1node.toml"


def test_plan_shows_the_mesh_and_refuses_an_impossible_one_writing_nothing(tmp_path):
    text = RECIPE.read_text()
    recipe = tmp_path / "r.toml"
    recipe.write_text(text)
    out = build(recipe, run_dir=tmp_path / "ok")
    assert "Trainer mesh: dp_replicate 1 x dp_shard 2 x cp 1 = 2 process(es); ep 1" in summary(out.plan, tmp_path)
    assert "dp_shard = 2" in out.files["components/trainer.toml"]
    recipe.write_text(text.replace("[trainer]\n", "[trainer]\nparallel.dp_shard = 3\n", 1))
    with pytest.raises(UserError) as e:
        build(recipe, run_dir=tmp_path / "bad")
    assert e.value.field == "trainer.parallel.dp_shard" and not (tmp_path / "bad").exists()
    for style, shown in (("", "ulysses or ring by the model's heads, at start"), ('parallel.cp_style = "ring"\n', "ring")):
        recipe.write_text(text.replace("[trainer]\n", f"[trainer]\nparallel.cp = 2\n{style}", 1))
        out = build(recipe, run_dir=tmp_path / f"cp{len(style)}")  # a hub id: no heads read at plan
        assert f"Trainer mesh: dp_replicate 1 x dp_shard 1 x cp 2 ({shown}) = 2 process(es)" in summary(out.plan, tmp_path)
        assert ('cp_style = "ring"' in out.files["components/trainer.toml"]) == bool(style)


def test_a_well_known_hub_id_is_checked_against_its_published_shape():
    """No config.json on the planning machine: the listed shape of the hub id answers (hub_shapes)."""
    with pytest.raises(UserError, match="ep 3 does not divide the model's 128 routed experts") as e:
        mesh.resolve(Parallel(ep=3), 3, 64, "Qwen/Qwen3-30B-A3B")
    assert e.value.field == "trainer.parallel.ep" and "published config.json of Qwen/Qwen3-30B-A3B" in e.value.message
    with pytest.raises(UserError, match="160 routed experts"):  # GLM-4.5, not GLM-4.5-Air's 128
        mesh.resolve(Parallel(ep=3), 3, 64, "zai-org/GLM-4.5")
    assert mesh.resolve(Parallel(ep=4), 4, 64, "zai-org/GLM-4.5-Air").dp_shard == 4
    assert mesh.resolve(Parallel(ep=8), 8, 64, "/models/Mixtral-8x7B-Instruct-v0.1").dp_shard == 8
    with pytest.raises(UserError, match="16 attention heads"):
        mesh.resolve(Parallel(cp=3, cp_style="ulysses"), 3, 66, "allenai/OLMoE-1B-7B-0924")
    assert mesh.resolve(Parallel(cp=3), 3, 66, "allenai/OLMoE-1B-7B-0924").cp_style == "ring"  # from its heads
    # a name that only starts like a listed one is not that model
    assert hub_shapes.known("Qwen/Qwen3-30B-A3Bx") is None and hub_shapes.known("org/my-model") is None
    assert hub_shapes.known("Qwen/Qwen3-30B-A3B-Instruct-2507") == hub_shapes.KNOWN["qwen3-30b-a3b"]


def test_hsdp_runs_but_not_beside_expert_parallelism(tmp_path):
    path = model(tmp_path, MOE)
    assert mesh.resolve(Parallel(dp_replicate=2, cp=2), 8, 64, path).dp_shard == 2
    with pytest.raises(UserError) as e:
        mesh.resolve(Parallel(dp_replicate=2, ep=2), 8, 64, path)
    assert e.value.field == "trainer.parallel.dp_replicate" and "ep = 1" in e.value.message


def test_lora_with_expert_parallelism_is_refused_at_plan_writing_nothing(tmp_path):
    """It used to pass plan and fail minutes into the job, when the trainer started."""
    moe = model(tmp_path, MOE)
    text = RECIPE.read_text().replace('path = "', f'path = "{moe}"  # was "', 1)
    recipe = tmp_path / "r.toml"
    recipe.write_text(text.replace("[trainer]\n", "[trainer]\nparallel.ep = 2\n", 1))
    assert build(recipe, run_dir=tmp_path / "ep").plan  # ep alone plans
    recipe.write_text(text.replace("[trainer]\n", "[trainer]\nparallel.ep = 2\nlora.rank = 8\n", 1))
    with pytest.raises(UserError) as e:
        build(recipe, run_dir=tmp_path / "lora")
    assert e.value.field == "trainer.parallel.ep" and "LoRA" in e.value.message and "\n" not in e.value.message
    assert not (tmp_path / "lora").exists()


def test_plan_prints_the_unknown_experts_warning(tmp_path):
    text = RECIPE.read_text()
    recipe = tmp_path / "r.toml"
    recipe.write_text(text.replace("[trainer]\n", "[trainer]\nparallel.ep = 2\n", 1)
                      .replace('path = "', 'path = "zai-org/GLM-5.1-FP8"  # was "', 1))
    out = build(recipe, run_dir=tmp_path / "glm")
    lines = [w for w in out.plan.warnings if "trainer.parallel.ep" in w]
    assert len(lines) == 1 and "'zai-org/GLM-5.1-FP8'" in lines[0]
    assert lines[0] in summary(out.plan, tmp_path)
