#!/usr/bin/env bash
# Install verifiers 0.3.1 (Prime Intellect's environments library, its classic API) into a virtual
# environment of its own, for `verifiers.<module>` environments (node/rl/environments/verifiers_adapter.py).
#
# Usage: scripts/install_verifiers.sh [VENV]   (default: build/verifiers-venv, git-ignored; created if missing)
# A node finds it there, or at $SWARMNODE_VERIFIERS_VENV. Nothing of it is imported by the node: the sandbox
# runs verifiers with this venv's packages read-only on its path, so the venv needs the node's Python
# version (the same interpreter makes it).
#
# Why its own venv: verifiers brings 717 MB of dependencies (pyarrow, pandas, datasets, openai, anthropic)
# the node does not share; constraints-verifiers.txt pins every one, as measured working.
# Idempotent: a second run checks, installs nothing new and takes a second.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-build/verifiers-venv}
PYTHON=${PYTHON:-$(.venv/bin/python -c 'import sys; print(sys.base_prefix)' 2>/dev/null)/bin/python3}
[ -x "$PYTHON" ] || PYTHON=python3
VERIFIERS=0.3.1
start=$SECONDS

installed=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('verifiers'))" 2>/dev/null \
  || true)
if [ "$installed" = "$VERIFIERS" ]; then
  echo "==> verifiers $VERIFIERS present in $VENV"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV ($("$PYTHON" --version))"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
echo "==> verifiers $VERIFIERS and its dependencies (about a minute)"
"$VENV/bin/python" -m pip install -q -c constraints-verifiers.txt "verifiers==$VERIFIERS"
echo "==> checking: import verifiers (its classic API)"
"$VENV/bin/python" -c "import verifiers as vf; vf.MultiTurnEnv; print('    verifiers', vf.__version__)"
echo "==> done in $((SECONDS - start)) s: $VENV ($(du -sh "$VENV" | cut -f1))"
