#!/usr/bin/env bash
# The GPU acceptance: the engines on a lent CUDA machine, prepared here so that it runs unchanged the moment
# one is available. The machine (an NVIDIA H200) has Python 3.12 with torch 2.11 and transformers in its
# image, no vLLM, no swarmnode dependencies and no network; a lease is 15 minutes in all (start and transfers
# included), at most 10 minutes and 64 MiB of carried, git-ignored files per command.
#
#   scripts/gpu_acceptance.sh prepare        here, once: wheels for the device into build/gpu-carry/
#   scripts/gpu_acceptance.sh plan           here: the device calls, in order, with what each carries
#   scripts/gpu_acceptance.sh transformers   device, phase 1 (carry build/gpu-carry/deps): the transformers
#                                            engine on CUDA as worker and validator, TOPLOC honest statistics
#                                            and the cheats at bf16 (benchmarks/bench_engines.py)
#   scripts/gpu_acceptance.sh part N         device, one call per vLLM part (carry build/gpu-carry/vllm-N)
#   scripts/gpu_acceptance.sh vllm [SECONDS] device, phase 2 (carry build/gpu-carry/deps): vLLM 0.26 from the
#                                            parts, the engine's tests, then the engines benchmark, within
#                                            SECONDS (default 580: 40% tests, the rest the benchmark)
#
# The transfer plan, measured: swarmnode needs one wheel the image lacks (pycryptodome, 2.2 MiB); vLLM 0.26
# and its dependencies beyond the image are 409 MB, 8 parts of at most 56 MiB, one call each (the working
# tree, ~6 MiB, travels with every call). Phase 1 alone fits a lease (1-2 minutes of start, at most 7 of
# work); so does phase 2 alone (start, 8 part calls, then `vllm 540`). Both in one lease do not fit whole:
# after phase 1 and the parts, about 4 minutes are left, so run `vllm 240` (tests, then the benchmark's
# first sections). The parts must go back to back while the machine stays warm (it keeps /tmp only while
# warm). Figures go to $OUT (the device's returned folder; build/gpu-out elsewhere): one JSON line per
# benchmark, and the logs.
#
# Measured on an H200, 2026-11-29 (phase 2 alone; the last part and `vllm 540` in one call): the start and
# 7 part calls took 65 s of the lease, each part call ~5 s; vLLM's install and the engine's tests (17
# passed) 194 s, most of it the first engine start compiling; the benchmark's engine then started in 50 s
# with the compile cache. The benchmark ran out of its 327 s in the timing section: the validator scored
# its logits on the CPU (31x the generation's time; it now scores them on the GPU, not yet measured
# there), so no JSON line came back; a probe at Qwen2.5-1.5B's shape and 64 tokens gave the README's
# figures.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=build/gpu-carry
OUT=${OUT:-build/gpu-out}
SITE=/tmp/swarmnode-site        # swarmnode's own dependencies, installed from the carried wheels
VLLM_SITE=/tmp/swarmnode-vllm   # vLLM 0.26 and what it needs beyond the image
PARTS=/tmp/swarmnode-parts
PYTHON=${PYTHON:-python3}
PY_VERSION=3.12                 # the device image's Python
# What swarmnode's engines, proofs and tests import that the image lacks (it has msgpack, pyarrow, jinja2,
# pytest and hypothesis), pinned as in constraints.txt: Keccak for the protocol's hashes.
# A rehearsal elsewhere: DEVICE=cpu SHAPE=small PYTHON=<a Python with only torch and transformers>.
DEPS=(pycryptodome)
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-qwen2.5-0.5b}
PART_MIB=56                     # a part and the working tree (~6 MiB) under the 64 MiB a call carries

platforms() {
  local p
  for p in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 \
           manylinux_2_34 manylinux_2_35 linux; do
    printf -- '--platform %s_x86_64 ' "$p"
  done
}

download() {  # download DIR REQUIREMENT...: wheels for the device's Python, no dependencies
  local dir=$1; shift
  # shellcheck disable=SC2046
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp $(platforms) -d "$dir" "$@" 2>&1 | grep -v '^WARNING: Location' || true
}

prepare() {
  local start=$SECONDS pins=() name pin
  mkdir -p "$CARRY/deps"
  for name in "${DEPS[@]}"; do
    pin=$(grep -i -E "^${name}==" constraints.txt || true)
    pins+=("${pin:-$name}")
  done
  echo "==> swarmnode's dependencies for Python $PY_VERSION -> $CARRY/deps"
  download "$CARRY/deps" "${pins[@]}"
  [ "$(ls "$CARRY/deps" | wc -l)" -ge "${#DEPS[@]}" ] || { echo "missing wheels in $CARRY/deps" >&2; exit 1; }
  if [ ! -f "$CARRY/vllm.sha256" ]; then
    echo "==> vLLM 0.26.0 and its dependencies beyond the image (scripts/gpu/vllm-0.26-wheels.txt)"
    local work
    work=$(mktemp -d)
    download "$work/wheels" -r scripts/gpu/vllm-0.26-wheels.txt
    local want got
    want=$(grep -c . scripts/gpu/vllm-0.26-wheels.txt)
    got=$(ls "$work/wheels" | wc -l)
    [ "$got" -ge "$want" ] || { echo "only $got of $want vLLM wheels downloaded" >&2; exit 1; }
    (cd "$work/wheels" && tar cf ../vllm.tar ./*.whl)
    rm -rf "$CARRY"/vllm-*
    (cd "$work" && split -b "${PART_MIB}M" -d vllm.tar part.)
    for part in "$work"/part.*; do
      mkdir -p "$CARRY/vllm-${part##*.}"
      mv "$part" "$CARRY/vllm-${part##*.}/"
    done
    sha256sum "$work/vllm.tar" | cut -d' ' -f1 > "$CARRY/vllm.sha256"
    rm -rf "$work"
  fi
  du -sh "$CARRY"/deps "$CARRY"/vllm-*
  echo "prepared in $((SECONDS - start)) s; the calls: scripts/gpu_acceptance.sh plan"
}

plan() {
  [ -d "$CARRY/deps" ] || { echo "run scripts/gpu_acceptance.sh prepare first" >&2; exit 1; }
  local dir n=1
  echo "device calls (each runs from the repository root; carry = the run tool's carried paths):"
  echo "$n. carry [\"$CARRY/deps\"]  timeout 480:  scripts/gpu_acceptance.sh transformers"
  for dir in "$CARRY"/vllm-*/; do
    dir=${dir%/}
    n=$((n + 1))
    echo "$n. carry [\"$dir\", \"$CARRY/vllm.sha256\"]  timeout 60:  scripts/gpu_acceptance.sh part ${dir##*-}"
  done
  echo "$((n + 1)). carry [\"$CARRY/deps\"]  timeout 600:  scripts/gpu_acceptance.sh vllm 540  (240 after phase 1; the last part may share this call)"
  echo "per call: $(du -sh "$CARRY/deps" | cut -f1) (deps), $(du -sh "$CARRY"/vllm-00 | cut -f1) (a part)"
}

python_path() {  # swarmnode importable as on an editable install, with the carried wheels
  mkdir -p "$SITE/swarmnode"
  local pkg
  for pkg in node protocol crypto ledger; do
    ln -sfn "$PWD/$pkg" "$SITE/swarmnode/$pkg"
  done
  if [ ! -f "$SITE/.installed" ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --find-links "$CARRY/deps" \
      "${DEPS[@]}"
    touch "$SITE/.installed"
  fi
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
}

describe() {
  "$PYTHON" - <<'EOF'
import platform, torch, transformers
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, {gpu}")
EOF
}

bench() {  # bench NAME TIMEOUT ARGS...: benchmarks/bench_engines.py, its JSON line to $OUT/NAME.json
  local name=$1 limit=$2 status=0; shift 2
  echo "==> $name: bench_engines.py $* (at most $limit s; progress in $OUT/$name.log)"
  timeout "$limit" "$PYTHON" benchmarks/bench_engines.py --device "$DEVICE" --shape "$SHAPE" "$@" \
    > "$OUT/$name.out" 2> "$OUT/$name.log" || status=$?
  tail -n 1 "$OUT/$name.out" > "$OUT/$name.json" || true
  tail -n 4 "$OUT/$name.log"
  echo "$name (exit $status): $(cat "$OUT/$name.json")"
}

transformers_phase() {
  mkdir -p "$OUT"
  describe | tee "$OUT/machine.txt"
  python_path
  # 4 prompts x 8 completions x 96 tokens per submission; 8 honest submissions after 2 that calibrate; 2 per
  # cheat. Transformers generates group by group (about 20 ms a token on a 0.5B model), so this is ~4 min.
  bench transformers 420 --worker-engine transformers --prompts 4 --group 8 \
    --new-tokens 96 --repeats 1 --calibration-submissions 2 --honest-submissions 8 --cheat-submissions 2
}

part() {
  local n=${1:?usage: gpu_acceptance.sh part N}
  mkdir -p "$PARTS"
  cp "$CARRY/vllm-$n"/part.* "$PARTS/"
  [ -f "$CARRY/vllm.sha256" ] && cp "$CARRY/vllm.sha256" "$PARTS/"
  ls -l "$PARTS"
}

vllm_phase() {
  mkdir -p "$OUT"
  describe | tee "$OUT/machine.txt"
  python_path
  if [ ! -f "$VLLM_SITE/.installed" ]; then
    echo "==> vLLM 0.26 from $(ls "$PARTS"/part.* | wc -l) parts"
    cat "$PARTS"/part.* > /tmp/swarmnode-vllm.tar
    [ "$(sha256sum /tmp/swarmnode-vllm.tar | cut -d' ' -f1)" = "$(cat "$PARTS/vllm.sha256")" ] \
      || { echo "the parts do not add up to the prepared pack: send every part again" >&2; exit 1; }
    mkdir -p /tmp/swarmnode-wheels && tar xf /tmp/swarmnode-vllm.tar -C /tmp/swarmnode-wheels
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$VLLM_SITE" /tmp/swarmnode-wheels/*.whl
    touch "$VLLM_SITE/.installed"
  fi
  export PYTHONPATH="$PYTHONPATH:$VLLM_SITE"  # after swarmnode's site: its pins win
  export VLLM_CACHE_ROOT=/tmp/swarmnode-vllm-cache  # the compile cache, shared by the tests and the benchmark
  local budget=${1:-580} status=0 start=$SECONDS
  echo "==> the vLLM engine's tests on CUDA (at most $((budget * 2 / 5)) s)"
  timeout $((budget * 2 / 5)) "$PYTHON" -m pytest -q -p no:cacheprovider -o addopts="" tests/rl/test_vllm_engine.py \
    > "$OUT/vllm-tests.log" 2>&1 || status=$?
  tail -n 5 "$OUT/vllm-tests.log"
  echo "vllm tests exit $status"
  # 8 x 8 x 256 tokens per submission; 16 honest submissions (1,024 sequences) and 4 per cheat. No `plain`
  # section: its second engine would start (compile, CUDA graphs) in a child, 2.5 minutes cold.
  bench vllm $((budget - (SECONDS - start))) --new-tokens 256 --sections timing,honest,cheats
}

case "${1:-}" in
  prepare) prepare ;;
  plan) plan ;;
  transformers) transformers_phase ;;
  part) part "${2:-}" ;;
  vllm) vllm_phase "${2:-}" ;;
  *) sed -n '2,32p' "$0"; exit 2 ;;
esac
