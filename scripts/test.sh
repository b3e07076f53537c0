#!/usr/bin/env bash
# Install, then run the whole test suite: the fast default set, then the slow multi-process tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
. .venv/bin/activate
echo "==> fast tests"
python -m pytest -q -p no:cacheprovider
echo "==> slow multi-process tests"
python -m pytest -q -p no:cacheprovider -m slow
echo "==> conformance vectors through the CLI"
swarmnode conformance >/dev/null && echo "conformance: all vectors pass"
