#!/usr/bin/env bash
# Run the test suite on a fresh machine: installs what it needs (`scripts/install.sh tests`), runs
# scripts/lint.sh (ruff and mypy; a finding fails the run before any test), then runs pytest.
# The Slurm tests start (and stop) their own local cluster, which installs the Debian
# packages it needs. Extra arguments go to pytest.
#
#   bash scripts/test.sh          everything (CI): three pytest-xdist workers; the tests that need
#                                 the local cluster run in two streams (one per partition of the
#                                 cluster), those that need real vLLM in a third, each one after
#                                 another on a worker of its own (tests/support/xdist_groups.py), the rest
#                                 beside them
#   bash scripts/test.sh --fast   the edit-test loop: no cluster, no vLLM, nothing marked slow
#                                 (under 3 minutes on two cores)
#
# -n 0 runs everything in one process, as pytest alone does.
set -euo pipefail
cd "$(dirname "$0")/.."
select=()
args=()
for arg in "$@"; do
    if [[ $arg == --fast ]]; then
        select=(-m "not cluster and not vllm and not slow")
    else
        args+=("$arg")
    fi
done
bash scripts/install.sh tests
bash scripts/lint.sh
exec .venv/bin/python -m pytest -n 3 --dist loadgroup --durations=30 "${select[@]}" "${args[@]}"
