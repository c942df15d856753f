#!/usr/bin/env bash
# The main job, start to finish, on this machine: bring up the local Slurm cluster (4 nodes x
# 4 fake GPUs, in network namespaces), build the tiny test model, submit the debug RL recipe
# (trainer, vLLM inference and orchestrator as het-job components), follow it, and show the
# reward curve (terminal chart + runs/rl-debug-<time>/reward.png). Needs root (the cluster does).
#
#   bash scripts/demo.sh [extra --set overrides for the recipe]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bash scripts/install.sh
py="$root/.venv/bin/python"

"$py" -m slurmrl.localcluster up
eval "$("$py" -m slurmrl.localcluster env)"

model="$root/runs/models/tiny"
[[ -f $model/model.safetensors ]] || "$py" -m slurmrl.runtime.tiny_model "$model"

# a new run dir each time: a run dir that exists is resumed (checkpoints, batches), never wiped
name="rl-debug-$(date +%Y%m%d-%H%M%S)"
"$py" -m slurmrl submit recipes/rl-debug.toml --set "name=\"$name\"" \
    --set "model.path=\"$model\"" --set "python.executable=\"$py\"" "$@"
"$py" -m slurmrl status "runs/$name" --watch || {
    echo "the job did not complete; its logs:" >&2
    "$py" -m slurmrl logs "runs/$name" | tail -n 60 >&2
    exit 1
}
"$py" -m slurmrl plot "runs/$name"
echo "The cluster is still up. Stop it with: $py -m slurmrl.localcluster down"
