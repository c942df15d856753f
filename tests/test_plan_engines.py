"""The planner's middle, one piece at a time: the tp x dp arithmetic (``slurmrl.plan.parallel``), the
engine protocol and its registry (``slurmrl.plan.engines``), and the supervisor model rendered by one
function (``slurmrl.plan.spec``)."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmrl.errors import UserError
from slurmrl.plan import Plan, engines, parallel, plan
from slurmrl.plan.engines import Engine, dynamo, judge, sglang, vllm
from slurmrl.plan.model import Cat, Instance, Sh
from slurmrl.plan.parallel import Parallelism, Slice
from slurmrl.plan.spec import Slot, Spec, Supervisor, supervisor_argv
from slurmrl.recipe import inference
from slurmrl.recipe.load import load_recipe, validate

RUN = "/cluster/runs/x"


def refusal(fn, *args, **kwargs) -> str:
    with pytest.raises(UserError) as e:
        fn(*args, **kwargs)
    return str(e.value)


def rl(**sections) -> dict:
    d = {
        "name": "x", "kind": "rl", "slurm": {"gpus_per_node": 8, "cpus_per_node": 64}, "model": {"path": "/m"},
        "inference": {}, "trainer": {"micro_batch_size": 1},
        "orchestrator": {"prompts_per_step": 8, "rollouts_per_prompt": 8},
    }
    for k, v in sections.items():
        d[k] = {**d.get(k, {}), **v}
    return d


# ---- parallel: the arithmetic, once ------------------------------------------------------------


def test_a_worker_that_fits_takes_one_node_and_one_that_does_not_takes_whole_nodes():
    assert parallel.worker_span(Parallelism("inference", tp=2, dp=2), gpn=8) == (1, 4)
    assert parallel.worker_span(Parallelism("inference", tp=4, dp=4), gpn=8) == (2, 8)
    assert parallel.worker_span(Parallelism("inference", tp=4, dp=4), gpn=8, span=4) == (4, 4)


def test_a_worker_refusal_names_the_field_its_engine_sizes_it_by():
    # vLLM sizes by tp x dp: the remedy is dp; Dynamo and the judge size by tp alone
    assert "inference.prefill.dp" in refusal(parallel.worker_span, Parallelism("inference.prefill", 4, 3), 8)
    msg = refusal(parallel.worker_span, Parallelism("inference", 12, by_tp=True), 8, tp_spans=True)
    assert msg.startswith("inference.tp") and "a worker of tp=12 spans whole nodes of 8 GPUs" in msg
    msg = refusal(parallel.worker_span, Parallelism("judge", 16, by_tp=True), 8)
    assert msg.startswith("judge.tp") and "needs more than the 8 GPUs of one node" in msg
    assert "nodes_per_worker" in refusal(parallel.worker_span, Parallelism("inference", 4, 4), 8, span=3)


def test_tensor_parallel_spans_nodes_only_where_the_engine_says_so():
    p = Parallelism("inference", tp=16, by_tp=True)
    assert parallel.worker_span(p, 8, tp_spans=True) == (2, 8)
    assert "; why" in refusal(parallel.worker_span, p, 8, one_node="; why")


def test_workers_per_node_and_their_gpus():
    p = Parallelism("inference", tp=2, dp=1)
    assert parallel.per_node(p, 8) == 4
    assert "tp x dp = 3 does not divide the 8 inference GPUs per node" in refusal(
        parallel.per_node, Parallelism("inference", 3), 8)
    assert "tp=3 does not divide the judge's 4 GPUs per node" in refusal(
        parallel.per_node, Parallelism("judge", 3, by_tp=True), 4, of="the judge's 4 GPUs")
    s = Slice(span=1, per_node=4, gpus=2)
    assert s.gpus_per_node == 8
    assert [s.task_gpus(tuple(range(2, 10)), k) for k in range(4)] == [(2, 3), (4, 5), (6, 7), (8, 9)]
    assert list(Slice(span=1, per_node=2, gpus=1).tasks((4, 5), nodes=2)) == [
        (0, 0, (4,)), (0, 1, (5,)), (1, 0, (4,)), (1, 1, (5,))]
    wide = Slice(span=2, per_node=1, gpus=8)  # one worker over two nodes: only the first serves
    assert [wide.leads(n) for n in range(4)] == [True, False, True, False]
    assert [wide.worker_at(w) for w in range(2)] == [(0, 0), (2, 0)]
    assert [s.worker_at(w) for w in (0, 3, 4, 9)] == [(0, 0), (0, 3), (1, 0), (2, 1)]


def test_replicas_spread_over_as_few_nodes_as_hold_them_unless_given():
    p = Parallelism("inference.decode", tp=2)
    assert parallel.spread(p, replicas=8, span=1, per=2, gpn=8) == (2, 8)
    assert parallel.spread(p, replicas=8, span=1, per=2, gpn=8, nodes=4) == (4, 4)
    assert parallel.spread(p, replicas=2, span=2, per=8, gpn=8) == (4, 8)
    assert "inference.decode.replicas" in refusal(parallel.spread, p, 3, 1, 2, 8, nodes=2)
    assert "3 workers x 2 nodes each need 6 nodes, not 4" in refusal(parallel.spread, p, 3, 2, 8, 8, nodes=4)
    msg = refusal(parallel.spread, p, 8, 1, 2, 8, nodes=2, first_gpu=4, left="; 4 go to prefill")
    assert msg == "inference.decode.nodes: 4 workers x 2 GPUs per node need 8 GPUs; nodes have 8; 4 go to prefill"
    assert "4 workers x tp=2 per node" in refusal(
        parallel.spread, Parallelism("inference.decode", 2, by_tp=True), 8, 1, 2, 6, nodes=2)


@given(tp=st.integers(1, 16), dp=st.integers(1, 16), gpn=st.integers(1, 16))
def test_a_placed_worker_fills_one_node_or_whole_nodes(tp, dp, gpn):
    p = Parallelism("inference", tp, dp)
    try:
        span, per = parallel.worker_span(p, gpn)
    except UserError as e:
        assert str(e).startswith(("inference.tp:", "inference.dp:"))
        return
    assert span * per == tp * dp and per <= gpn and tp <= gpn
    assert span == 1 or per == gpn
    if span == 1:
        assert per % tp == 0  # whole engines; across nodes the caller checks tp against the node (per_node)


# ---- the supervisor: one model, one renderer ---------------------------------------------------


def test_the_supervisor_renders_its_options_in_one_order_before_the_double_dash():
    py = ("python",)
    assert supervisor_argv(py, Supervisor("trainer")) == (
        "python", "-m", "slurmrl.runtime.steps.supervise", "trainer", "--")
    url = Sh(sh="http://${host}:${PORT_DYNAMO_FRONTEND}")
    argv = supervisor_argv(py, Supervisor("frontend", gpus="0:2", ready=url, heartbeat=60, cuda_runtime=True,
                                          ready_model="m", ready_instances=3, ready_workers=Sh(sh="${#w[@]}"),
                                          ready_completion="m"))
    assert argv[4:] == ("--gpus", "0:2", "--ready", url, "--heartbeat", "60", "--cuda-runtime", "--ready-model", "m",
                        "--ready-instances", "3", "--ready-workers", Sh(sh="${#w[@]}"), "--ready-completion", "m",
                        "--")


def test_readiness_is_decided_where_the_component_is_built():
    p = plan(validate(rl(inference={"nodes": 1, "tp": 2}, trainer={"nodes": 1})), RUN)
    router = p.component("router").task.supervisor
    assert router[router.index("--ready-completion") + 1] == "/m" and "--ready-workers" in router
    assert "--ready-completion" not in p.component("inference").task.supervisor  # the router's completion reaches it
    one = plan(validate(rl(inference={"nodes": 1, "tp": 8}, trainer={"nodes": 1})), RUN)
    assert not any(c.name == "router" for c in one.components)
    assert "--ready-completion" in one.component("inference").task.supervisor


# ---- engines: one protocol, one registry -------------------------------------------------------


def test_every_registered_engine_family_implements_the_protocol():
    assert [e.name for e in engines.ENGINES] == ["vllm", "dynamo", "sglang", "judge"]
    for e in engines.ENGINES:
        assert isinstance(e, Engine)


def test_every_backend_has_its_section_and_its_engine_and_nothing_else():
    """A new engine: its section (one line in recipe.inference.Inference) and its module (one line in
    plan.engines.BACKENDS); the two registries name the same backends, each section keyed on its own."""
    assert list(inference.BACKENDS) == list(engines.BACKENDS) == ["vllm", "dynamo", "sglang"]
    for backend, section in inference.BACKENDS.items():
        assert issubclass(section, inference.Serving)
        assert section.model_fields["backend"].annotation == Literal[backend]
        assert engines.BACKENDS[backend].name == backend and engines.BACKENDS[backend] in engines.ENGINES
        recipe = validate(rl(inference={"backend": backend}))  # the loader picks the section by backend
        assert type(recipe.inference) is section
        assert [e.name for e in engines.BACKENDS.values() if e.serves(recipe)] == [backend]
    assert type(validate(rl()).inference) is inference.BACKENDS["vllm"]  # no backend: vLLM


def test_planner_and_rules_ask_no_engine_by_name():
    """What differs per engine is in its module; the planner and the recipe rules call the protocol."""
    for module in ("planner.py", "rules.py"):
        text = (Path(engines.__file__).parent.parent / module).read_text()
        for name in engines.BACKENDS:
            assert not re.search(rf"[=!]=\s*[\"']{name}[\"']", text), (module, name)
        assert not re.search(r"\.backend\s*[=!]=", text), module  # inference.backend (not weight_sync's)
        assert "import dynamo" not in text and "engines.dynamo" not in text, module


@pytest.mark.parametrize("key, backend, other", [
    ("kv_offload", "dynamo", "vllm"), ("router", "dynamo", "vllm' and 'sglang"), ("enable_eplb", "dynamo", "vllm"),
    ("dynamo", "vllm", "dynamo"), ("vllm_extra", "sglang", "vllm"), ("kv_offload", "sglang", "vllm"),
    ("enable_dp_attention", "vllm", "sglang"),
])
def test_a_key_of_another_engine_is_an_unknown_key_that_names_its_engine(key, backend, other):
    value = {"enable_eplb": True, "enable_dp_attention": True}.get(key, {})
    data = rl(inference={"backend": backend, key: value})
    msg = refusal(validate, data)
    assert msg.startswith(f"inference.{key}: not a key of backend {backend!r} (a key of backend '{other}')"), msg
    assert "\n" not in msg


@pytest.mark.parametrize("recipe", ["inference-replicas", "inference-dynamo-agg", "inference-sglang", "rl-judge",
                                    "sft-debug"])
def test_each_recipe_is_served_by_the_families_it_names(recipe):
    r = load_recipe(f"recipes/{recipe}.toml")
    served = {e.name for e in engines.ENGINES if e.serves(r)}
    want = {"inference-replicas": {"vllm"}, "inference-dynamo-agg": {"dynamo"}, "inference-sglang": {"sglang"},
            "rl-judge": {"vllm", "judge"}, "sft-debug": set()}[recipe]
    assert served == want
    assert vllm.serves(r) + dynamo.serves(r) + sglang.serves(r) <= 1 and judge.serves(r) == (r.judge is not None)


def fake_engine(calls: list[str]) -> types.ModuleType:
    """A new engine family as a module would be: it serves every RL recipe with one CPU task beside
    the trainer."""
    m = types.ModuleType("echo")
    m.name = "echo"
    m.leftover_check = False

    def check(r):
        calls.append("check")
        if r.env.get("ECHO") == "bad":
            raise UserError("env.ECHO", "echo refuses 'bad'")

    def resolve(r):
        calls.append("resolve")
        return r

    def serves(r):
        return r.kind == "rl"

    def place(ctx):
        calls.append("place")
        ctx.slots["echo"] = Slot(ctx.slots["trainer"].group, 0, 1, ())

    def build(ctx):
        calls.append("build")
        slot = ctx.slots["echo"]
        ctx.add(Spec(name="echo", role="echo", group=slot.group, first_node=0, nodes=1, tasks_per_node=1,
                     cpus_per_task=1, gpus_per_node=0, stage=2,
                     instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={}),),
                     task=ctx.task(Supervisor("echo", ready="started"), command=("echo", "hello"))))

    m.check, m.resolve, m.serves, m.place, m.build = check, resolve, serves, place, build
    return m


def test_a_new_engine_family_is_one_package_registered_in_one_place(monkeypatch):
    calls: list[str] = []
    echo = fake_engine(calls)
    assert isinstance(echo, Engine)
    monkeypatch.setattr(engines, "ENGINES", (*engines.ENGINES, echo))
    p: Plan = plan(validate(rl(inference={"nodes": 1}, trainer={"nodes": 1})), RUN)
    assert calls == ["check", "resolve", "place", "build"]
    c = p.component("echo")
    assert c.task.command == ("echo", "hello") and c.stage == 2 and c.srun[-2] == "--kill-on-bad-exit=1"
    assert "echo" in p.stages[[s.title for s in p.stages].index("inference servers")].components
    with pytest.raises(UserError, match="env.ECHO: echo refuses 'bad'"):
        plan(validate(rl(inference={"nodes": 1}, trainer={"nodes": 1}, env={"ECHO": "bad"})), RUN)


# ---- model.stage: the staged path is known before the command line is written ------------------


def test_node_local_model_copy_is_what_the_servers_and_the_benchmark_read():
    r = load_recipe("recipes/inference-replicas.toml", [
        "model.path=/shared/m", "model.stage=node-local", "model.stage_dir=/local",
        "benchmark.concurrencies=[1]", "benchmark.input_lens=[8]", "benchmark.output_lens=[8]"])
    p = plan(r, RUN)
    for name in ("inference", "benchmark"):
        cmd = p.component(name).task.command
        model = cmd[cmd.index("--model") + 1]
        assert isinstance(model, Cat) and model.parts[0] == "/local/", name
        assert cmd[cmd.index("--served-model-name") + 1] == "/shared/m"  # the name clients use stays
    assert [s.group for s in p.staging] == [p.component("inference").group]
    probe = plan(r, RUN, preflight=True)  # the probe stands in: nothing copied, nothing refused
    assert probe.staging == ()


@pytest.mark.parametrize("recipe", ["inference-replicas", "inference-dynamo-disagg"])
def test_a_resolved_recipe_loads_as_its_backends_section(tmp_path, recipe):
    """A run dir's recipe.toml writes every default out, the backend's too; read back, only what
    differs from the defaults counts as set, and the section is the backend's again."""
    from slurmrl.app.build import build

    resolved = tmp_path / "recipe.toml"
    resolved.write_text(build(Path(f"recipes/{recipe}.toml"), run_dir=tmp_path / "run").files["recipe.toml"])
    again, first = load_recipe(resolved), load_recipe(f"recipes/{recipe}.toml")
    assert again == first and type(again.inference) is type(first.inference)
    assert ("backend" in again.inference.model_fields_set) == (recipe != "inference-replicas")  # vllm: the default
