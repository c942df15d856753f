#!/usr/bin/env bash
# benchmarks/gpu_check.sh: the trainer's GPU figures, one call per PARTS choice (each < 10 min on one H100 or H200).
#
# Runs from a checkout on a machine with nothing but torch, transformers and triton (no vLLM), and
# says what each part measures as it starts it. On a machine without CUDA it runs up to the first
# part that needs CUDA, says so, and exits 0.
#
#   0. wheels:   installs .whl/*.whl (pydantic, pydantic-core, annotated-types, typing-inspection,
#                submitit, cloudpickle, typing-extensions, pytest + its deps, hypothesis)
#                into this interpreter (--no-index --no-deps). Fetch them on a networked machine
#                first: `bash benchmarks/gpu_check.sh --fetch-wheels` (PYVER, default 3.12, must be
#                the device image's Python).
#   1. here:     torch / transformers versions, the device, grouped_mm and varlen attention present,
#                and every trainer module imports (context_parallel, expert_parallel, router_replay).
#   -- CUDA from here on --
#   2. tests:    the gpu-marked tests (pytest -m gpu): fast path on CUDA, bf16.
#   3. dense:    trainer_bench.py, true Qwen3-0.6B shape, RL 4 x 16k tokens: the trainer's fast path
#                and the plain transformers step beside it (tokens/s, peak memory, MFU 6N and 6N+12LHS).
#   4. MoE:      trainer_bench.py, the Qwen3-30B-A3B shape (128 experts, top 8, hidden 2048) with
#                as many layers as fit (3 under 100 GiB, 6 above), RL 2 x 8k: fast path and reference;
#                MFU counts active parameters (experts x top_k / experts).
#   5. trainer:  component_bench.py: the trainer component as job.sbatch starts it (torchrun, settings
#                file, rollout files, filesystem weight publish after each step) at the Qwen3-0.6B
#                shape, 4 x 16k per step: per-step time, tokens/s, sync seconds.
#   6. profile:  step_profile.py: torch.profiler over one fast-path step at that shape: top kernels
#                by device time and the share per kind (attention, GEMM, copy/cast, ...).
#   7. attention: attention_bench.py: per-document attention kernels on one packed row at that
#                shape (4 x 16k, 16/8 heads x 128), forward + backward, each against the reference:
#                varlen flash (what the trainer runs), SDPA per document under cuDNN / flash /
#                efficient, FlexAttention with a document block mask. Chooses the trainer's kernel.
# PARTS picks the CUDA parts (default "2 3 4 5 6 7", about 11 minutes at the default limits: more than
# one device call's 10, so split them: PARTS="2 3 5 7" then PARTS="4 6").
# Each part has its own time limit (LIMIT_<part> seconds) and its own log under $OUT
# (default gpu-check-out/); a failing part is reported and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONPATH=$ROOT TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}
OUT=${OUT:-$ROOT/gpu-check-out}
WHEELS="pydantic pydantic-core annotated-types typing-inspection submitit cloudpickle typing-extensions
        pytest pluggy iniconfig packaging hypothesis sortedcontainers attrs"

if [[ ${1:-} == --fetch-wheels ]]; then
    mkdir -p .whl
    # shellcheck disable=SC2086
    exec "$PY" -m pip download --only-binary=:all: --no-deps --python-version "${PYVER:-3.12}" \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl $WHEELS
fi

mkdir -p "$OUT"
started=$SECONDS
PARTS=" ${PARTS:-2 3 4 5 6 7} "  # the CUDA parts to run: all of them take about 11 minutes, one call has 10
CURRENT=0
part() { CURRENT=$1; echo; echo "=== $1 [$(date -u +%H:%M:%S), ${SECONDS}s in]: $2"; }
run() {  # run NAME LIMIT CMD...: output to the screen and $OUT/NAME.log; one line with its exit status
    local name=$1 limit=$2; shift 2
    if [[ $CURRENT -ge 2 && $PARTS != *" $CURRENT "* ]]; then echo "[$name: skipped, not in PARTS=$PARTS]"; return; fi
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "[$name: exit $rc$([[ $rc == 124 ]] && echo ", stopped at its ${limit}s limit")]"
}

part 0 "wheels this image lacks (.whl/)"
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install --quiet --no-index --no-deps .whl/*.whl && echo "installed: $(ls .whl | wc -l) wheels"
else
    echo "no .whl/ here: using what is installed"
fi

part 1 "what this machine has"
"$PY" - <<'PY'
import importlib, torch, transformers
print(f"torch {torch.__version__}, transformers {transformers.__version__}")
print("CUDA:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
print("grouped_mm:", hasattr(torch.nn.functional, "grouped_mm") or hasattr(torch, "_grouped_mm"))
try:
    from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    print("varlen_attn: yes")
except ImportError:
    print("varlen_attn: no")
for m in ("loop", "context_parallel", "expert_parallel", "router_replay", "token_forward"):
    importlib.import_module(f"slurmrl.runtime.trainer.{m}")
print("trainer modules import")
PY
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo; echo "no CUDA device: parts 2-7 need one; stopping here (exit 0)."
    exit 0
fi
gib=$("$PY" -c "import torch; print(torch.cuda.get_device_properties(0).total_memory // 2**30)")
moe_layers=$([[ $gib -gt 100 ]] && echo 6 || echo 3)

part 2 "gpu-marked tests (pytest -m gpu)"
if "$PY" -c "import pytest" 2>/dev/null; then
    run tests "${LIMIT_tests:-80}" "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_trainer_fast_path.py
else
    echo "pytest is not installed (bring it in .whl/): skipped"
fi

part 3 "dense: trainer_bench, Qwen3-0.6B shape, RL 4 x 16k, fast path vs plain step"
run dense "${LIMIT_dense:-140}" "$PY" benchmarks/trainer_bench.py --preset qwen3-0.6b --mode rl --steps 2 --reference

part 4 "MoE: trainer_bench, Qwen3-30B-A3B shape x $moe_layers layers ($gib GiB), RL 2 x 8k, fast path vs plain step"
run moe "${LIMIT_moe:-240}" "$PY" benchmarks/trainer_bench.py --preset qwen3-30b-a3b --layers "$moe_layers" \
    --mode rl --steps 2 --reference

part 5 "the trainer component (torchrun, rollout files, publish per step), Qwen3-0.6B shape, 4 x 16k"
run trainer "${LIMIT_trainer:-110}" "$PY" benchmarks/component_bench.py --preset qwen3-0.6b --steps 3

part 6 "profile of one fast-path step, Qwen3-0.6B shape, 4 x 16k"
run profile "${LIMIT_profile:-70}" "$PY" benchmarks/step_profile.py --preset qwen3-0.6b --mode rl --top 15

part 7 "per-document attention kernels, Qwen3-0.6B heads, 4 x 16k, forward + backward"
run attention "${LIMIT_attention:-90}" "$PY" benchmarks/attention_bench.py

echo; echo "=== done in $((SECONDS - started))s; logs in $OUT"
