#!/usr/bin/env bash
# Install swarmnode into ./.venv on a fresh machine (CPU build of torch), with the test tools.
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
if ! command -v bwrap >/dev/null; then
  # The code sandbox (node/sandbox/): graded programs run only under bubblewrap, never without it.
  echo "==> bubblewrap (the code sandbox, from Debian's packages)"
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }
  else
    echo "    not installed: run 'sudo apt-get install bubblewrap' (a node refuses code tasks without it)" >&2
  fi
fi
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  # Test-only: tests/swarm/test_dashboard_devnet.py loads each node's dashboard in headless Chromium
  # (skipped without it); a node never needs a browser.
  echo "==> chromium (test-only: the dashboard's browser test, from Debian's packages)"
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } \
      || echo "    could not install chromium: the dashboard's browser test will be skipped" >&2
  else
    echo "    not installed: run 'sudo apt-get install chromium' (the dashboard's browser test is skipped without it)" >&2
  fi
fi
echo "==> torch 2.13.0 (CPU build)"
python -m pip install -q torch==2.13.0
echo "==> swarmnode and its pinned dependencies"
# setuptools' editable mode for a package-dir mapping (swarmnode.node = node/, ...) prints an
# "Editable installation" notice about folders named like the package; there is no swarmnode/ folder here.
PYTHONWARNINGS="ignore:Editable installation" python -m pip install -q -c constraints.txt -e ".[test]"
if [ -x scripts/install_anvil.sh ]; then
  echo "==> anvil (local EVM chain, from npm)"
  scripts/install_anvil.sh >/dev/null
fi
echo "==> installed: $(swarmnode version)"
