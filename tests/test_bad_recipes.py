"""Bad recipes: every one exits 2 with one line naming the field, and writes nothing.

Most cases run the CLI in-process (fast); a handful run it as a real subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmrl import cli

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

SFT = """\
name = "bad"
kind = "sft"
[slurm]
gpus_per_node = 8
cpus_per_node = 64
[model]
path = "m"
[trainer]
dataset = "/d.jsonl"
"""

RL = """\
name = "bad"
kind = "rl"
[slurm]
gpus_per_node = 8
cpus_per_node = 64
[model]
path = "m"
[inference]
nodes = 1
[trainer]
micro_batch_size = 1
[orchestrator]
prompts_per_step = 8
rollouts_per_prompt = 8
"""

INF = """\
name = "bad"
kind = "inference"
[slurm]
gpus_per_node = 8
cpus_per_node = 64
[model]
path = "m"
[inference]
nodes = 1
"""

PD = INF.replace("nodes = 1\n", "") + """\
mode = "pd"
[inference.prefill]
replicas = 2
tp = 2
[inference.decode]
replicas = 2
tp = 2
"""

# (id, base recipe text (or full text), --set overrides, expected field, text the message must contain)
CASES = [
    # unknown keys at several depths, with a did-you-mean
    ("unknown-top", RL, ["nmae=x"], "nmae", "did you mean 'name'"),
    ("unknown-slurm", RL, ["slurm.partiton=gpu"], "slurm.partiton", "did you mean 'partition'"),
    ("unknown-router", RL, ["inference.router.polcy=round_robin"], "inference.router.polcy", "did you mean 'policy'"),
    ("unknown-kv-offload", INF, ["inference.kv_offload.cpugb=1"], "inference.kv_offload.cpugb", "did you mean 'cpu_gb'"),
    ("unknown-pd-role", PD + "replica = 3\n", [], "inference.decode.replica", "did you mean 'replicas'"),
    ("unknown-trainer-toml", SFT + "learning_rate = 1e-5\n", [], "trainer.learning_rate", "unknown key"),
    # wrong types
    ("type-gpus", RL, ['slurm.gpus_per_node="eight"'], "slurm.gpus_per_node", "integer"),
    ("type-nodes-zero", RL, ["trainer.nodes=0"], "trainer.nodes", "greater than or equal to 1"),
    ("type-extra-args", INF, ['inference.extra_args="--enforce-eager"'], "inference.extra_args", "list"),
    ("type-extra-args-item", INF, ["inference.extra_args=[{a=1}]"], "inference.extra_args.0", "string"),
    ("type-env-value", RL, ["env.NCCL_DEBUG=true"], "env.NCCL_DEBUG", "string"),
    ("type-lr", SFT, ["trainer.lr=-1"], "trainer.lr", "greater than 0"),
    ("type-gpu-mem", INF, ["inference.gpu_memory_utilization=1.5"], "inference.gpu_memory_utilization", "1.5"),
    ("type-port-base", INF, ["placement.port_base=80"], "placement.port_base", "1024"),
    # bad enums
    ("enum-kind", RL, ["kind=ppo"], "kind", "'sft', 'rl' or 'inference'"),
    ("enum-mode", INF, ["inference.mode=tensor"], "inference.mode", "'replicas'"),
    ("enum-dtype", RL, ["model.dtype=int8"], "model.dtype", "'bfloat16'"),
    ("enum-connector", PD, ["inference.kv_connector=Lmcache"], "inference.kv_connector", "NixlConnector"),
    # single-field formats
    ("bad-time", RL, ['slurm.time="1 hour"'], "slurm.time", "not a Slurm time"),
    ("bad-time-days", RL, ['slurm.time="1d"'], "slurm.time", "not a Slurm time"),
    ("bad-signal", RL, ["slurm.signal=USR1@"], "slurm.signal", "SIGNAL[@SECONDS]"),
    ("bad-signal-name", RL, ["slurm.signal=USR3@60"], "slurm.signal", "not a signal name"),
    ("bad-signal-kill", RL, ["slurm.signal=KILL@60"], "slurm.signal", "cannot be caught"),
    ("bad-mail-type", RL, ["slurm.mail_type=END,FAILURE"], "slurm.mail_type", "not a mail type"),
    ("bad-partition", RL, ['slurm.partition="gpu debug"'], "slurm.partition", "not one word"),
    ("bad-mem", RL, ["slurm.mem=lots"], "slurm.mem", "memory size"),
    ("bad-extra-directive", RL, ['slurm.extra_directives=["reservation=x"]'], "slurm.extra_directives", "'-'"),
    ("bad-name", RL, ['name="my run"'], "name", "my run"),
    # protected environment
    ("env-cuda", RL, ['env.CUDA_VISIBLE_DEVICES="0"'], "env", "CUDA_VISIBLE_DEVICES"),
    ("env-slurm", RL, ['env.SLURM_JOB_ID="1"'], "env", "SLURM_JOB_ID"),
    ("env-trainer-master", RL, ['trainer.env.MASTER_PORT="1"'], "trainer.env", "MASTER_PORT"),
    ("env-pd-role", PD, ['inference.decode.env.VLLM_NIXL_SIDE_CHANNEL_PORT="5"'], "inference.decode.env",
     "VLLM_NIXL_SIDE_CHANNEL_PORT"),
    ("env-bad-name", RL, ['orchestrator.env.1BAD="x"'], "orchestrator.env", "1BAD"),
    ("env-secret", RL, ['trainer.env.WANDB_API_KEY="abc"'], "trainer.env", "looks like a secret"),
    ("env-secret-global", RL, ['env.HF_TOKEN="abc"'], "env", "looks like a secret"),
    # container
    ("container-mount-no-dst", RL, ["container.image=img", 'container.mounts=["/a"]'], "container.mounts", "/a"),
    ("container-mount-comma", RL, ["container.image=img", 'container.mounts=["/a:/b,/c:/d"]'], "container.mounts",
     "comma"),
    ("container-no-image", RL, ['container.mounts=["/a:/b"]'], "container.image", "required"),
    ("container-env-name", RL, ["container.image=img", 'container.env=["HF TOKEN"]'], "container.env", "HF TOKEN"),
    # sections per kind
    ("missing-model", 'name = "bad"\nkind = "sft"\n[trainer]\ndataset = "/d"\n', [], "model", "required"),
    ("sft-missing-trainer", INF.replace('kind = "inference"', 'kind = "sft"').replace("[inference]\nnodes = 1\n", ""),
     [], "trainer", "needs a [trainer]"),
    ("rl-missing-inference", RL.replace("[inference]\nnodes = 1\n", ""), [], "inference", "needs a [inference]"),
    ("inference-with-trainer", INF, ["trainer.nodes=1"], "trainer", "not used by kind 'inference'"),
    ("sft-with-orchestrator", SFT, ["orchestrator.cpus=2"], "orchestrator", "not used by kind 'sft'"),
    ("sft-with-inference", SFT, ["inference.tp=1"], "inference", "not used by kind 'sft'"),
    ("sft-without-dataset", SFT.replace('dataset = "/d.jsonl"\n', ""), [], "trainer.dataset", "JSONL"),
    # placement
    ("share-without-colocate", RL, ["placement.share_gpus=true"], "placement.share_gpus", "colocate"),
    ("colocate-inference-kind", INF, ["placement.colocate=true"], "placement.colocate", "kind 'rl'"),
    ("colocate-no-inference-gpus", RL, ["placement.colocate=true"], "inference.gpus_per_node", "how many"),
    ("colocate-two-trainer-nodes", RL, ["placement.colocate=true", "inference.gpus_per_node=4", "trainer.nodes=2"],
     "trainer.nodes", "one node"),
    ("colocate-no-gpus-left", RL, ["placement.colocate=true", "inference.gpus_per_node=8"], "trainer.gpus_per_node",
     "cannot have 0"),
    ("colocate-orchestrator-on-inference", RL,
     ["placement.colocate=true", "inference.gpus_per_node=4", "orchestrator.placement=inference"],
     "orchestrator.placement", "colocated"),
    # orchestrator environment
    ("env-unknown", RL, ['orchestrator.environment="chess"'], "orchestrator.environment", "not built in"),
    ("env-arg-unknown", RL, ['orchestrator.environment="arithmetic"', "orchestrator.environment_args={fewshot=2}"],
     "orchestrator.environment_args.fewshot", "takes max_operand, few_shot"),
    ("env-arg-type", RL, ['orchestrator.environment="arithmetic"', 'orchestrator.environment_args={few_shot="2"}'],
     "orchestrator.environment_args.few_shot", "must be int"),
    ("env-arg-value", RL, ['orchestrator.environment="arithmetic"', "orchestrator.environment_args={few_shot=-1}"],
     "orchestrator.environment_args", "few_shot >= 0"),
    # topology
    ("tp-dp-not-dividing", INF, ["inference.tp=3"], "inference.tp", "does not divide"),
    ("tp-larger-than-node", INF, ["inference.tp=16"], "inference.tp", "one node"),
    ("pd-tp-larger-than-node", PD, ["inference.prefill.tp=16"], "inference.prefill.tp", "16"),
    ("pd-missing-decode", INF + 'mode = "pd"\n[inference.prefill]\nreplicas = 1\n', [], "inference.decode",
     "[inference.decode]"),
    ("pd-router-disabled", PD, ["inference.router.enabled=false"], "inference.router.enabled", "router"),
    ("pd-with-dp", PD, ["inference.dp=2"], "inference.dp", "remove dp"),
    ("eplb-without-ep", INF, ["inference.enable_eplb=true"], "inference.enable_eplb", "expert_parallel = true"),
    ("dbo-role-without-ep", PD, ["inference.enable_dbo=true"], "inference.enable_dbo",
     "prefill.expert_parallel and decode.expert_parallel"),
    ("routed-experts-pd", PD, ["inference.return_routed_experts=true"], "inference.return_routed_experts", "P/D"),
    ("routed-experts-dense", INF, ["inference.return_routed_experts=true"], "inference.return_routed_experts",
     "mixture-of-experts"),
    ("routed-experts-offload", INF, ["inference.return_routed_experts=true", 'inference.kv_offload.kind="cpu"',
                                     "inference.kv_offload.cpu_gb=8"], "inference.return_routed_experts", "offload"),
    ("vllm-extra-owned", INF, ["inference.vllm_extra={port=1}"], "inference.vllm_extra", "port table"),
    ("vllm-extra-field", INF, ["inference.vllm_extra={tensor_parallel_size=2}"], "inference.vllm_extra", "use tp"),
    ("vllm-extra-bad-name", INF, ['inference.vllm_extra={"Max-Seqs"=1}'], "inference.vllm_extra",
     "not a vLLM argument"),
    ("vllm-extra-twice", PD, ["inference.vllm_extra={max_num_seqs=8}",
                              'inference.decode.extra_args=["--max-num-seqs", "9"]'], "inference.vllm_extra",
     "give it once"),
    ("kv-buffer-outside-pd", INF, ['inference.kv_buffer_device="cpu"'], "inference.kv_buffer_device", "mode 'pd'"),
    ("share-nodes-outside-pd", INF, ["inference.share_nodes=true"], "inference.share_nodes", "mode 'pd'"),
    ("pd-share-nodes-mismatch", PD, ["inference.share_nodes=true", "inference.prefill.nodes=1",
                                     "inference.decode.nodes=2"], "inference.decode.nodes", "same nodes"),
    ("pd-worker-not-whole-nodes", PD, ["inference.decode.tp=4", "inference.decode.dp=3"], "inference.decode.dp",
     "multiple of 8"),
    ("pd-worker-nodes-mismatch", PD, ["inference.decode.dp=4", "inference.decode.tp=4", "inference.decode.nodes=3"],
     "inference.decode.nodes", "need 4 nodes"),
    ("replica-workers-not-whole", INF, ["inference.nodes=3", "inference.dp=16"], "inference.nodes", "multiple of 2"),
    ("prefill-outside-pd", INF, ["inference.prefill.replicas=2"], "inference.prefill", "mode 'pd'"),
    ("wide-ep-dp-mismatch", INF, ["inference.mode=wide_ep", "inference.nodes=2", "inference.dp=10"], "inference.dp",
     "multiple of 8"),
    ("replicas-not-spreading", PD, ["inference.prefill.replicas=3", "inference.prefill.nodes=2"],
     "inference.prefill.replicas", "evenly"),
    ("replicas-too-many-per-node", PD, ["inference.decode.replicas=4", "inference.decode.tp=4",
                                        "inference.decode.nodes=1"], "inference.decode.nodes", "16 GPUs"),
    ("kv-offload-no-cpu-gb", INF, ["inference.kv_offload.kind=cpu"], "inference.kv_offload.cpu_gb", "> 0"),
    ("kv-offload-disk-no-path", INF, ["inference.kv_offload.kind=cpu_disk", "inference.kv_offload.cpu_gb=8",
                                      "inference.kv_offload.disk_gb=100"], "inference.kv_offload.disk_path",
     "disk_path"),
    ("nccl-share-gpus", RL, ["placement.colocate=true", "placement.share_gpus=true", "trainer.weight_sync=nccl"],
     "trainer.weight_sync", "same GPU"),
    ("nccl-sft", SFT, ["trainer.weight_sync=nccl"], "trainer.weight_sync", "kind 'rl'"),
    ("ipc-not-shared", RL, ["trainer.weight_sync=ipc"], "trainer.weight_sync", "share_gpus"),
    ("broadcast-hybrid", RL, ['placement.colocate="hybrid"', "placement.share_gpus=true", "trainer.weight_sync=ipc",
                              "orchestrator.max_off_policy_steps=0"],
     "trainer.weight_sync", "hybrid"),
    ("broadcast-lora", RL, ["trainer.weight_sync=gloo", "trainer.lora={rank=8}"], "trainer.weight_sync", "LoRA"),
    ("timeout-filesystem", RL, ["trainer.weight_sync_timeout=60"], "trainer.weight_sync_timeout", "by broadcast"),
    ("rl-batch-not-divisible", RL, ["orchestrator.prompts_per_step=3", "orchestrator.rollouts_per_prompt=3"],
     "orchestrator.prompts_per_step", "does not split"),
    ("rl-batch-size-mismatch", RL, ["trainer.batch_size=32"], "trainer.batch_size", "64"),
    ("sft-batch-not-divisible", SFT, ["trainer.batch_size=36", "trainer.micro_batch_size=4"], "trainer.batch_size",
     "does not split"),
    ("micro-larger-than-batch", SFT, ["trainer.micro_batch_size=100"], "trainer.micro_batch_size", "larger"),
    ("trainer-gpus-more-than-node", RL, ["trainer.gpus_per_node=16"], "trainer.gpus_per_node", "more than"),
    ("inference-gpus-zero", INF, ["inference.gpus_per_node=0"], "inference.gpus_per_node", "at least 1"),
    ("no-gpus", RL, ["slurm.gpus_per_node=0"], "slurm.gpus_per_node", "needs GPUs"),
    ("rollouts-one", RL, ["orchestrator.rollouts_per_prompt=1"], "orchestrator.rollouts_per_prompt", "at least 2"),
    ("too-few-cpus", RL, ["slurm.cpus_per_node=2"], "slurm.cpus_per_node", "raise it"),
    # --set syntax
    ("set-no-equals", RL, ["slurm.partition"], "--set", "KEY.PATH=VALUE"),
    ("set-empty-key", RL, [".a=1"], "--set", "KEY.PATH=VALUE"),
    ("set-into-value", RL, ["name.x=1"], "name", "not a table"),
    ("set-unknown", RL, ["slurm.nodez=2"], "slurm.nodez", "unknown key"),
    # files
    ("toml-malformed", 'name = "bad"\nkind = \n', [], "recipe.toml", "not valid TOML"),
    ("toml-duplicate-key", 'name = "again"\n' + RL, [], "recipe.toml", "not valid TOML"),
    ("toml-duplicate-key-in-table", RL.replace('path = "m"\n', 'path = "m"\npath = "n"\n'), [], "recipe.toml",
     'key "path" is given twice (or a value and a table share a name) (at line 8, column 11)'),
    ("toml-duplicate-inline-key", RL, ["orchestrator.environment_args={a=1, a=2}"], "--set",
     'not valid TOML: key "a" is given twice in one inline table'),
    ("toml-duplicate-table", RL + "[model]\n", [], "recipe.toml", "table [model] is declared twice"),
    ("toml-too-deep", RL.replace("[slurm]\n", "x = " + "[" * 5000 + "]" * 5000 + "\n[slurm]\n"), [],
     "recipe.toml", "nested too deeply"),
    ("empty-file", "", [], "recipe.toml", "is empty"),
    ("comments-only", "# nothing yet\n\n", [], "recipe.toml", "is empty"),
    ("nul-bytes", RL + "\x00", [], "recipe.toml", "not a text file"),
    # numbers: non-finite floats, integers beyond 64 bits, ranges (in the file and through --set)
    ("lr-inf-file", SFT + "lr = 1e999\n", [], "trainer.lr", "not a finite number"),
    ("lr-nan-file", SFT + "lr = nan\n", [], "trainer.lr", "not a finite number"),
    ("lr-inf-set", SFT, ["trainer.lr=1e999"], "trainer.lr", "finite number"),
    ("lr-minus-inf-set", SFT, ["trainer.lr=-inf"], "trainer.lr", "finite number"),
    ("lr-too-large", SFT, ["trainer.lr=2.0"], "trainer.lr", "less than or equal to 1"),
    ("max-steps-beyond-64-bits", SFT, ["trainer.max_steps=1000000000000000000000000000000"], "trainer.max_steps",
     "64 bits"),
    ("max-steps-too-many", SFT, ["trainer.max_steps=9223372036854775807"], "trainer.max_steps", "1000000000"),
    ("env-arg-beyond-64-bits", RL, ["orchestrator.environment_args={x=18446744073709551616}"],
     "orchestrator.environment_args.x", "64 bits"),
    ("env-arg-inf", RL, ["orchestrator.environment_args={x=inf}"], "orchestrator.environment_args.x", "finite"),
    ("env-value-nan-in-file", RL + "[env]\nX = nan\n", [], "env.X", "not a finite number"),
    ("gpus-per-node-huge", RL, ["slurm.gpus_per_node=1000000000000"], "slurm.gpus_per_node", "64"),
    ("inference-nodes-huge", RL, ["inference.nodes=1000000000000"], "inference.nodes", "16384"),
    ("job-too-big", INF, ["inference.nodes=16384", "slurm.gpus_per_node=64"], "inference.nodes", "131072"),
    ("pd-too-big", PD, ["inference.prefill.replicas=131072"], "inference.prefill.replicas", "131072"),
    ("seed-negative", RL, ["trainer.seed=-1"], "trainer.seed", "greater than or equal to 0"),
    ("signal-seconds", RL, ["slurm.signal=USR1@65536"], "slurm.signal", "65535"),
    ("time-days", RL, ["slurm.time=400-00:00:00"], "slurm.time", "365 days"),
    ("mem-huge", RL, ["slurm.mem=99999999999999999999T"], "slurm.mem", "64T"),
    ("lora-rank", INF, ["inference.max_lora_rank=12"], "inference.max_lora_rank", "320"),
    ("startup-timeout", INF, ["inference.startup_timeout=100000000"], "inference.startup_timeout", "86400"),
    ("min-servers-above-servers", RL, ["inference.min_servers=100"], "inference.min_servers", "set at most"),
    ("min-servers-serving-job", INF, ["inference.min_servers=2"], "inference.min_servers", "only applies to kind 'rl'"),
    ("grace", RL, ["slurm.grace_seconds=86400"], "slurm.grace_seconds", "3600"),
    ("cpu-gb-inf", INF, ["inference.kv_offload.kind=cpu", "inference.kv_offload.cpu_gb=inf"],
     "inference.kv_offload.cpu_gb", "finite"),
    ("lora-above-servers", RL, ["trainer.lora={rank=32}", "inference.max_lora_rank=16"], "trainer.lora.rank",
     "more than inference.max_lora_rank (16)"),
    ("lora-sft", SFT, ["trainer.lora={}"], "trainer.lora", "only applies to kind 'rl'"),
    ("lora-pd", RL.replace("[inference]\nnodes = 1\n", "[inference]\n"), ["trainer.lora={}", 'inference.mode="pd"', "inference.prefill={tp=1}", "inference.decode={tp=1}"],
     "trainer.lora", "use inference mode 'replicas'"),
    ("lora-target-name", RL, ['trainer.lora={target_modules=["q.proj"]}'], "trainer.lora.target_modules",
     "not a module name"),
    ("lora-target-twice", RL, ['trainer.lora={target_modules=["q_proj", "q_proj"]}'], "trainer.lora.target_modules",
     "named twice"),
    ("lora-rank-zero", RL, ["trainer.lora.rank=0"], "trainer.lora.rank", "greater than or equal to 1"),
    ("lora-dropout", RL, ["trainer.lora.dropout=0.95"], "trainer.lora.dropout", "0.9"),
    # --set: bad key paths and values
    ("set-double-dot", RL, ["slurm..partition=gpu"], "--set", "KEY.PATH=VALUE"),
    ("set-trailing-dot", RL, ["slurm.=gpu"], "--set", "KEY.PATH=VALUE"),
    ("set-table-as-value", RL, ["trainer=3"], "trainer", "dictionary"),
    ("set-bad-toml-number", RL, ["trainer.lr=1e-5x"], "trainer.lr", "number"),
    ("set-bad-toml-array", RL, ["inference.extra_args=[1"], "--set", "not valid TOML"),
    ("set-bad-toml-string", RL, ['model.path="m'], "--set", "not valid TOML"),
    ("set-too-deep", RL, ["trainer.lr=" + "[" * 5000], "--set", "not valid TOML: a value is nested too deeply"),
    ("templates-dir-missing", 'templates_dir = "nowhere"\n' + RL, [], "templates_dir", "job.sbatch.j2"),
    # issue 17: staging and topology
    ("stage-hub-id", INF, ['model.stage="node-local"'], "model.stage", "is not an absolute path"),
    ("stage-dir-without-stage", INF, ['model.stage_dir="/x"'], "model.stage_dir", "only applies with model.stage"),
    ("stage-sft", SFT.replace('path = "m"', 'path = "/m"'), ['model.stage="node-local"'], "model.stage",
     "no vLLM server of this job reads model.path"),
    ("stage-bogus", INF, ['model.stage="everywhere"'], "model.stage", "'shared' or 'node-local'"),
    ("cache-relative", INF + '[container]\nimage = "nvcr.io#x/y:1"\n', ['container.cache="cache"'],
     "container.cache", "is not an absolute path"),
    ("cache-of-a-file", INF + '[container]\nimage = "/img/y.sqsh"\n', ['container.cache="/c"'],
     "container.cache", "is a squashfs file already"),
    ("switches-unknown-group", INF, ['slurm.switches.trainer="1"'], "slurm.switches.trainer",
     "no het group named 'trainer'; this job's groups: inference"),
    ("switches-bad-format", INF, ['slurm.switches.inference="1@soon"'], "slurm.switches.inference", "not a Slurm time"),
    ("segment-not-divisor", INF.replace("nodes = 1", "nodes = 3"), ["slurm.segment.inference=2"],
     "slurm.segment.inference", "do not split into segments of 2"),
    ("nvlink-unknown-group", RL, ['slurm.nvlink_domain=["decode"]'], "slurm.nvlink_domain", "no het group named 'decode'"),
]


def write_recipe(tmp: Path, text: str) -> Path:
    (tmp / "recipe.toml").write_text(text)
    return tmp / "recipe.toml"


def argv_for(overrides: list[str], command: str = "render") -> list[str]:
    out = [command, "recipe.toml"]
    for o in overrides:
        out += ["--set", o]
    return out


def check_one_line(err: str, field: str, needle: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), repr(err)
    line = lines[0]
    assert line.startswith(f"slurmrl: error: {field}: "), line
    assert needle in line, line
    assert "Traceback" not in err


def assert_nothing_written(tmp: Path) -> None:
    assert sorted(os.listdir(tmp)) == ["recipe.toml"], os.listdir(tmp)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_recipe_in_process(case, tmp_path, monkeypatch, capsys):
    _, text, overrides, field, needle = case
    write_recipe(tmp_path, text)
    monkeypatch.chdir(tmp_path)
    rc = cli.main(argv_for(overrides))
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert out == ""
    check_one_line(err, field, needle)
    assert_nothing_written(tmp_path)


def test_enough_cases():
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


SUBPROCESS = ["unknown-slurm", "env-slurm", "pd-missing-decode", "wide-ep-dp-mismatch", "nccl-share-gpus",
              "set-no-equals", "toml-malformed", "toml-duplicate-key-in-table", "gpus-per-node-huge",
              "inference-nodes-huge", "lr-inf-file", "max-steps-beyond-64-bits", "empty-file"]


@pytest.mark.parametrize("name", SUBPROCESS)
def test_bad_recipe_subprocess(name, tmp_path):
    _, text, overrides, field, needle = next(c for c in CASES if c[0] == name)
    write_recipe(tmp_path, text)
    p = subprocess.run([PY, "-m", "slurmrl", *argv_for(overrides)], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stdout == ""
    check_one_line(p.stderr, field, needle)
    assert_nothing_written(tmp_path)


def test_missing_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["render", "nope.toml"])
    _, err = capsys.readouterr()
    assert rc == 2
    check_one_line(err, "nope.toml", "no such recipe file")
    assert os.listdir(tmp_path) == []


def test_missing_file_subprocess(tmp_path):
    p = subprocess.run([PY, "-m", "slurmrl", "plan", "nope.toml"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert p.returncode == 2
    check_one_line(p.stderr, "nope.toml", "no such recipe file")
    assert os.listdir(tmp_path) == []


def test_recipe_is_a_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "dir.toml").mkdir()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["render", "dir.toml"]) == 2
    check_one_line(capsys.readouterr().err, "dir.toml", "is a directory")
    assert os.listdir(tmp_path) == ["dir.toml"]


@pytest.mark.parametrize("data,needle", [
    (bytes(range(256)) * 4, "is not a text file (byte 128 is not UTF-8)"),
    ("name = 'caf\u00e9'\n".encode("latin-1"), "is not a text file (byte 11 is not UTF-8)"),
    (b"\x7fELF\x02\x01\x01\x00" + bytes(64), "not a text file (it holds NUL bytes)"),
    (b"\xff\xfen\x00a\x00m\x00e\x00", "is not a text file (byte 0 is not UTF-8)"),  # UTF-16
    (b"# x\n" * 300_000, "larger than 1 MiB"),
])
def test_binary_or_huge_recipe(data, needle, tmp_path, monkeypatch, capsys):
    (tmp_path / "recipe.toml").write_bytes(data)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["render", "recipe.toml"]) == 2
    check_one_line(capsys.readouterr().err, "recipe.toml", needle)
    assert_nothing_written(tmp_path)


def test_unreadable_recipe(tmp_path, monkeypatch, capsys):
    """Permission denied (faked: the tests run as root, who reads anything)."""
    from slurmrl.rundir import read

    recipe = write_recipe(tmp_path, RL).resolve()
    monkeypatch.chdir(tmp_path)
    real_open = os.open

    def no_access(path, *a, **k):  # every file slurmrl reads is opened by slurmrl.rundir.read
        if Path(path).resolve() == recipe:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(read.os, "open", no_access)
    assert cli.main(["render", "recipe.toml"]) == 2
    check_one_line(capsys.readouterr().err, "recipe.toml", "permission denied")
    assert_nothing_written(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_unreadable_recipe_for_real(tmp_path, monkeypatch, capsys):
    write_recipe(tmp_path, RL).chmod(0)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["render", "recipe.toml"]) == 2
    check_one_line(capsys.readouterr().err, "recipe.toml", "permission denied")


def test_duplicate_key_subprocess(tmp_path):
    """The case that once gave a 31-line tomlkit traceback, as a user runs it: our words, the line tomllib read."""
    (tmp_path / "r.toml").write_text('name = "x"\nkind = "sft"\n[model]\npath = "m"\npath = "n"\n')
    p = subprocess.run([PY, "-m", "slurmrl", "render", "r.toml"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    check_one_line(p.stderr, "r.toml",
                   'not valid TOML: key "path" is given twice (or a value and a table share a name) (at line 5, column 11)')
    assert os.listdir(tmp_path) == ["r.toml"]


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_other_commands_report_the_same_error(command, tmp_path, monkeypatch, capsys):
    write_recipe(tmp_path, RL)
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv_for(["inference.tp=3"], command)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    check_one_line(err, "inference.tp", "does not divide")
    assert_nothing_written(tmp_path)


def test_good_base_recipes_are_good(tmp_path, monkeypatch, capsys):
    """The bases above are valid, so each case fails for its own reason only."""
    monkeypatch.chdir(tmp_path)
    for text in (SFT, RL, INF, PD):
        (tmp_path / "recipe.toml").write_text(text)
        assert cli.main(["validate", "recipe.toml"]) == 0, capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
