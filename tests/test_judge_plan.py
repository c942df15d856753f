"""The [judge] component in the plan and the script: placement (own het group, or GPUs of the inference
nodes), ports from the server block, its real vLLM command line (parsed by vLLM's own parser), the
orchestrator's --judge-urls, and recipes that are refused with one line naming the field."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from task_expand import expand

from slurmrl import cli
from slurmrl.app.build import build

ROOT = Path(__file__).resolve().parent.parent
GALLERY = ROOT / "recipes" / "rl-judge.toml"

RL = """\
name = "judged"
kind = "rl"
[slurm]
gpus_per_node = 4
cpus_per_node = 16
[model]
path = "policy"
[inference]
gpus_per_node = 1
[trainer]
gpus_per_node = 1
micro_batch_size = 4
[orchestrator]
environment = "judge"
environment_args = { prompts_from = "arithmetic" }
prompts_per_step = 4
rollouts_per_prompt = 4
[judge]
[judge.model]
path = "judge-model"
"""


def built(tmp_path: Path, text: str = RL, sets: list[str] = ()):
    f = tmp_path / "recipe.toml"
    f.write_text(text)
    run_dir = Path(tempfile.mkdtemp(dir=tmp_path))  # the script's prologue writes there when a task is expanded
    return build(f, list(sets), run_dir=str(run_dir))


def test_own_group_command_line_and_orchestrator_urls(tmp_path):
    out = built(tmp_path, sets=["judge.tp=2", "judge.gpus_per_node=4", 'judge.env={VLLM_CPU_KVCACHE_SPACE="1"}'])
    p = out.plan
    judge = p.component("judge")
    group = p.groups[judge.group]
    assert (group.name, group.gpus_per_node, judge.tasks_per_node) == ("judge", 4, 2)
    assert [i.ports for i in judge.instances] == [{"http": "server_0"}, {"http": "server_1"}]
    assert judge.stage == p.component("inference").stage and not judge.main
    assert "--kill-on-bad-exit=1" in judge.srun  # a judge that exits fails the job
    task = expand(out.script, p, "judge", local=1)
    cmd = task.command
    assert cmd[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert task.after("--model") == "judge-model" and task.after("--tensor-parallel-size") == "2"
    assert int(task.after("--port")) == int(expand(out.script, p, "judge").after("--port")) + 1
    assert "--runner" not in cmd and task.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert task.supervisor[task.supervisor.index("--gpus") + 1] == "2:2"  # its second server's GPUs
    orch = expand(out.script, p, "orchestrator", env={"URLS_INFERENCE": "http://a:1", "URLS_JUDGE": "http://j:1 http://j:2"})
    assert orch.command[orch.command.index("--judge-urls") + 1:] == ["http://j:1", "http://j:2"]
    settings = p.component("orchestrator").settings.judge
    assert settings.served_model_name == "judge-model" and "{completion}" in settings.template


def test_sharing_the_inference_node(tmp_path):
    p = built(tmp_path, sets=['judge.placement="inference"', "judge.gpus_per_node=2"]).plan
    inf, judge = p.component("inference"), p.component("judge")
    assert judge.group == inf.group and inf.overlap and judge.overlap  # each narrows to its own GPU slice
    assert [(i.gpus, i.ports["http"]) for i in judge.instances] == [((1,), "server_1"), ((2,), "server_2")]
    colocated = built(tmp_path, sets=['judge.placement="inference"', "placement.colocate=true"]).plan
    assert [c.instances[0].gpus for c in (colocated.component(n) for n in ("inference", "trainer", "judge"))] == [
        (0,), (1,), (2,)]


def test_the_gallery_recipe_places_its_judge_beside_inference_and_the_trainer():
    with tempfile.TemporaryDirectory() as run_dir:
        p = build(GALLERY, run_dir=run_dir).plan
    assert p.component("judge").instances[0].gpus == (6, 7)
    assert "{reference}" in p.component("orchestrator").settings.judge.template


BAD = [
    ("judge-no-model", RL.replace('[judge.model]\npath = "judge-model"\n', ""), [], "judge.model", "is required"),
    ("template-no-completion", RL, ['judge.template="rate {prompt}"'], "judge.template", "no {completion}"),
    ("template-index", RL, ['judge.template="{0} {completion}"'], "judge.template", "not a plain name"),
    ("template-spec", RL, ['judge.template="{completion:>5}"'], "judge.template", "no format spec"),
    ("template-brace", RL, ['judge.template="{completion} {"'], "judge.template", "literal braces"),
    ("template-unknown-field", RL, ['judge.template="{prompt}{completion} {answer}"'], "judge.template",
     "{answer} is not a field of 'arithmetic' tasks; they have {completion}, {prompt}, {target}"),
    ("env-without-judge", RL.split("[judge]")[0], [], "orchestrator.environment", "add a [judge]"),
    ("judge-with-builtin-env", RL, ['orchestrator.environment="arithmetic"', "orchestrator.environment_args={}"],
     "orchestrator.environment", "not through the [judge]"),
    ("reward-model-max-tokens", RL, ['judge.kind="reward_model"', "judge.max_tokens=4"], "judge.max_tokens",
     "kind 'generative'"),
    ("tp-not-dividing", RL, ["judge.tp=2", "judge.gpus_per_node=3"], "judge.tp", "does not divide"),
    ("gpus-beyond-node", RL, ["judge.gpus_per_node=8"], "judge.gpus_per_node", "more than the 4"),
    ("no-room-beside-inference", RL, ['judge.placement="inference"', "judge.gpus_per_node=4"], "judge.gpus_per_node",
     "do not fit"),
    ("share-gpus", RL, ['judge.placement="inference"', "placement.colocate=true", "placement.share_gpus=true"],
     "judge.placement", "GPUs of its own"),
    ("more-nodes-than-inference", RL, ['judge.placement="inference"', "judge.nodes=2"], "judge.nodes", "there are 1"),
    ("prompts-from-unknown", RL, ['orchestrator.environment_args={prompts_from="chess"}'],
     "orchestrator.environment_args", "not a built-in"),
    ("timeout-zero", RL, ["judge.timeout=0"], "judge.timeout", "greater than or equal to 1"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_judge_recipes_exit_2_with_one_line(case, tmp_path, monkeypatch, capsys):
    _, text, sets, field, needle = case
    (tmp_path / "recipe.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    argv = ["render", "recipe.toml"]
    for s in sets:
        argv += ["--set", s]
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", (out, err)
    assert len(err.splitlines()) == 1 and err.startswith(f"slurmrl: error: {field}: "), err
    assert needle in err, err
    assert os.listdir(tmp_path) == ["recipe.toml"]


VLLM_PARSE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
out = []
for argv in json.load(sys.stdin):
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    e = AsyncEngineArgs.from_cli_args(args)
    out.append({"runner": e.runner, "tp": e.tensor_parallel_size, "model": e.model, "name": e.served_model_name,
                "eager": e.enforce_eager, "max_len": e.max_model_len, "middleware": args.middleware})
print(json.dumps(out))
"""


@pytest.mark.vllm
def test_vllm_parses_both_kinds_of_judge(tmp_path, vllm_python):
    argvs = []
    for kind in ("generative", "reward_model"):
        sets = [f'judge.kind="{kind}"', "judge.tp=2", "judge.enforce_eager=true", "judge.model.max_model_len=2048"]
        if kind == "reward_model":
            sets.append('judge.template="{prompt}{completion}"')
        out = built(tmp_path, sets=sets)
        cmd = expand(out.script, out.plan, "judge").command
        argvs.append(cmd[cmd.index("vllm.entrypoints.openai.api_server") + 1:])
    p = vllm_python.run(VLLM_PARSE, input=json.dumps(argvs))
    assert p.returncode == 0, p.stderr[-3000:]
    gen, rm = json.loads(p.stdout.strip().splitlines()[-1])
    assert gen["runner"] == "auto" and rm["runner"] == "pooling"
    for got in (gen, rm):
        assert (got["tp"], got["model"], got["eager"], got["max_len"]) == (2, "judge-model", True, 2048)
        assert got["middleware"] == ["slurmrl.runtime.gates.job_auth.RequireJobSecret"]


def test_preflight_reads_the_judge_environments_dataset(tmp_path, monkeypatch):
    from slurmrl.runtime.steps.probe import environment_problems

    text = RL.replace('{ prompts_from = "arithmetic" }', '{ dataset = "prompts.jsonl" }')
    out = built(tmp_path, text)
    run_dir = out.run_dir
    (run_dir / "components").mkdir(exist_ok=True)
    (run_dir / "components" / "orchestrator.toml").write_text(out.files["components/orchestrator.toml"])
    monkeypatch.chdir(tmp_path)  # where the job starts: a relative dataset is found from there
    (problem,) = environment_problems(run_dir)
    assert "cannot read dataset 'prompts.jsonl'" in problem, problem
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "2+2="}\n')
    assert environment_problems(run_dir) == []
    (tmp_path / "prompts.jsonl").write_text('{"question": "2+2="}\n')
    (problem,) = environment_problems(run_dir)
    assert "prompts.jsonl:1: needs an object with a text 'prompt'" in problem, problem
